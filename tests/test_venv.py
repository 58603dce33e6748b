"""What the Python reference checks (tokenizer_check.py, dataset_check.py) share: running inside
the test virtual environment scripts/test.sh prepares, or reporting themselves skipped (exit code
77, which CTest's SKIP_RETURN_CODE maps to SKIPPED) with the reason."""
import argparse
import os
import sys

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def reexec_or_skip(venv, error, what):
    """After an ImportError `error`: re-executes the script with the venv's Python when it is not
    already running there, else skips naming `what` was missing (and why the venv setup failed)."""
    venv_py = os.path.join(venv or "", "bin", "python")
    if venv and os.path.exists(venv_py) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(venv_py, [venv_py] + sys.argv)
    why = ""
    failed = os.path.join(venv or "", "SETUP_FAILED")
    if venv and os.path.exists(failed):
        with open(failed) as f:
            why = " (" + f.read().strip() + ")"
    skip(f"Python packages {what} unavailable: {error}{why}; scripts/test.sh installs them")


def argument_parser(packages):
    """The options every check takes: the ferry binary, a work folder and the venv holding
    `packages` (re-executed in); a check adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--venv", help=f"virtual environment with {packages} (re-executed in)")
    return ap


class Tally:
    """The comparisons a check made and the mismatches it found; the first `shown` mismatches are
    printed with the reference's value and ferry's."""

    def __init__(self, shown):
        self.compared = 0
        self.mismatches = 0
        self.shown = shown

    def report(self, kind, name, case, want, got):
        self.mismatches += 1
        if self.mismatches <= self.shown:
            print(f"MISMATCH {name} {kind} on {case!r}:\n  reference {want}\n  ferry     {got}")
