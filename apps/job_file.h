// Job files: `ferry --config FILE <command>` reads a TOML file whose keys are the command's long
// options without the dashes (`steps = 100`, `lora-rank = 8`); options on the command line win.
// CLI11 processes config files on the top-level app only, so --config lives there (the
// subcommands let it fall through) and the reader files top-level keys under the subcommand that
// was selected (train when none was); a `[plan]` section sets `ferry plan`'s keys.
//
// CLI11 2.1 keeps no line numbers and reports a bad key or value in its own words, so the reader
// checks every item before CLI11 applies it: an unknown key (with the closest option: "did you
// mean"), an unknown section, a key that is not a job option, several values for one, or a value
// that is not of the option's type is a CLI::ConfigError that starts with "FILE:LINE: ". The
// options the file set are kept in a JobFileKeys, so a command's later error about one of them
// (`lr = -1`: "--lr must be a positive number") names the file, the line and the key too.
//
// Thread-compatible; JobFileKeys is owned by main and outlives the commands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <map>
#include <string>

#include "kernels/status.h"

namespace ferry {

// What a job file set: for each option it gave a value ("--lr"), the key and the value as written
// and where. Filled by the reader while CLI11 parses.
class JobFileKeys {
 public:
  struct Entry {
    std::string key;    // as written: "lr", "plan.lr"
    std::string value;  // the value(s) as CLI11 read them, joined by ", "
    size_t item = 0;    // index among the file's items (JobFileItemLine)
  };

  // "FILE:LINE: lr = -1" for the first option (a "--name" word) in `message` that the job file
  // set; "" when it set none of them.
  std::string Where(const std::string& message) const;
  // `s` with Where(s.message()) as its context; `s` itself when that is empty.
  Status Annotate(const Status& s) const;

  // For the reader: a new file `file` with contents `text`, and the options it sets.
  void Reset(std::string file, std::string text);
  void Set(const std::string& option, Entry entry);
  // "FILE:LINE" of the `item`-th item (0-based) of the file.
  std::string Location(size_t item) const;
  const std::string& file() const { return file_; }
  // Whether the file gave `option` ("--steps") a value.
  bool Sets(const std::string& option) const { return options_.count(option) > 0; }

 private:
  std::string file_, text_;
  std::map<std::string, Entry> options_;  // by option name, "--lr"
};

// The 1-based line on which CLI11's TOML reader starts the `item`-th item (0-based, counting key
// items only) of `text`; 0 when there is no such item.
size_t JobFileItemLine(const std::string& text, size_t item);

// Why `value` is no 64-bit whole number for an option of CLI11 type `type` ("INT" or "UINT"):
// CLI11 2.1 reads numbers with strtoll/strtoull and does not look at ERANGE, so
// `--steps 99999999999999999999` would become 2^63 - 1 steps, and `--seed -1` 2^64 - 1. "" when
// it is one (or `type` is not an integer type).
std::string IntegerProblem(const std::string& type, const std::string& value);

// Gives every integer option of `app` and its subcommands a check that refuses, naming the option,
// what IntegerProblem finds. Call once every option is added.
void RefuseOutOfRangeIntegers(CLI::App& app);

// keys->Annotate(s), or `s` when there are no keys.
inline Status AnnotateJobFile(const JobFileKeys* keys, const Status& s) {
  return keys == nullptr ? s : keys->Annotate(s);
}

// Gives `app` the --config option and the job-file reader described above, recording into *keys
// (which must outlive parsing and the commands' use of it).
void InstallJobFile(CLI::App& app, JobFileKeys* keys);

}  // namespace ferry
