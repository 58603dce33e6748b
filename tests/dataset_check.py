#!/usr/bin/env python3
"""ferry's dataset tokenization and chat templates against independent references.

Builds small real BPE tokenizer.json files with Hugging Face `tokenizers` (byte-level in the
styles of Qwen2 and Llama 3, Metaspace with byte fallback in the style of Mistral), then reads
dataset files with `ferry tokenize --data FILE --jsonl` (the examples exactly as `ferry train`
sees them: ids and the loss mask) and checks:

1. prompt/completion: ferry's ids equal `tokenizers`' encoding of prompt + completion (with the
   tokenizer's special tokens, plus the EOS ferry appends), for boundaries inside words, at
   spaces, between multi-byte characters and next to special tokens; and the mask is the rule
   examples.h states: a token is trained iff its byte range overlaps the completion (a token
   straddling the boundary is trained; BOS is not; the appended EOS is).
2. chat: conversations (with and without a system message, one to four turns, contents with
   leading/trailing ASCII and Unicode whitespace, newlines, multi-byte text) rendered by the
   real Jinja chat templates in tests/chat_templates/ with `jinja2`, the way transformers'
   apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks, bos/eos tokens,
   add_generation_prompt=False): ferry's text must equal it, its ids must equal `tokenizers`'
   encoding of that text without special tokens (what apply_chat_template(tokenize=True) gives),
   and its mask must cover exactly the tokens overlapping each assistant turn's content and its
   end-of-turn marker. The template is detected by ferry from tokenizer_config.json's
   chat_template, as for a downloaded model; templates ferry must refuse (Llama 2's <<SYS>>,
   Mistral v0.3's) are checked to fail with a message suggesting --chat-template.
3. chat prompts: `ferry generate --chat`'s prompt (a user turn, with and without a system turn,
   as `ferry tokenize --chat --jsonl` encodes it) equals the template rendered with
   add_generation_prompt=True, its ids `tokenizers`' encoding of that text without special
   tokens, and its stop the tokenizer's id of the template's end-of-turn marker.
4. tool use: under Qwen2.5's, Qwen3's and Llama 3.1's templates, random chats with a `tools`
   list, tool calls (OpenAI's form or bare for Qwen; arguments objects holding every kind of JSON
   value, or JSON strings) and runs of 'tool' results (Llama: 'ipython' too, and results that
   are JSON objects or arrays), rendered with
   transformers' `tojson` (json.dumps, ensure_ascii=False; Llama's tools with indent=4): text,
   ids and mask equal. Under the others, four lines (a 'tools' list, an empty one, tool_calls, a
   'tool' result): where the template writes tool use its own way (a Llama 3.1 template with
   other tool clauses, checked with jinja2) ferry refuses the line naming it, and a tool call
   under every template; where the template ignores it (Llama 3.0's, Mistral v0.2's) ferry's text
   equals jinja2's.

Exit codes: 0 all equal, 1 a mismatch or failure, 77 skipped (Python packages unavailable).
"""
import json
import os
import random
import subprocess
import sys

from test_venv import Tally, argument_parser, reexec_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))

ap = argument_parser("tokenizers and jinja2")
ap.add_argument("--cases", type=int, default=400, help="pairs and conversations per tokenizer")
args = ap.parse_args()

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
    import tokenizers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import processors
    from tokenizer_fixtures import (LLAMA3_PAT, QWEN_PAT, add_byte_fallback_tokens,
                                    split_then_byte_level, train)
except ImportError as e:
    reexec_or_skip(args.venv, e, "tokenizers/jinja2")

os.makedirs(args.work, exist_ok=True)
rng = random.Random(4321)

# ---- text ------------------------------------------------------------------------------------
WORDS = ("the quick brown fox jumps over lazy dog I'm don't HELLO World naïve café Straße "
         "fine-tune tokens answer question 42 3.14 x").split()
MULTI = ["中文字符", "日本語の", "한국어", "😀", "👍🏽", "e\u0301", "Ωmega", "ÅNGSTRÖM", "🇯🇵"]
SPACE = [" ", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", " \n"]
PUNCT = list(".,;:!?()\"'-") + ["...", "'s"]


def text(specials=(), n=None):
    out = []
    for _ in range(rng.randint(0, 10) if n is None else n):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(WORDS))
        elif r < 0.65:
            out.append(rng.choice(MULTI))
        elif r < 0.75:
            out.append(rng.choice(PUNCT))
        elif r < 0.92 or not specials:
            out.append(rng.choice(SPACE))
        else:
            out.append(rng.choice(specials))
        if rng.random() < 0.5:
            out.append(" ")
    return "".join(out)


TRAIN = [text(n=12) for _ in range(3000)]

# ---- tokenizers ------------------------------------------------------------------------------
def bos_template(tok, bos):
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])


def byte_level(pat, specials, bos=None):
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = split_then_byte_level(pat)
    t.decoder = decoders.ByteLevel()
    train(t, TRAIN, 900, specials)
    if bos:
        bos_template(t, bos)
    else:
        t.post_processor = processors.ByteLevel(trim_offsets=False)
    return t


def metaspace(specials, bos):
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    train(t, TRAIN, 600, specials, byte_level=False, limit_alphabet=80)
    j = json.loads(t.to_str())
    add_byte_fallback_tokens(j)  # the trained specials are in the vocabulary: ids follow it
    t = Tokenizer.from_str(json.dumps(j))
    bos_template(t, bos)
    return t


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>"]
TOKENIZERS = {
    "qwen": (byte_level(QWEN_PAT, QWEN_SPECIALS), None, "<|endoftext|>", QWEN_SPECIALS),
    "llama3": (byte_level(LLAMA3_PAT, LLAMA3_SPECIALS, "<|begin_of_text|>"), "<|begin_of_text|>",
               "<|end_of_text|>", LLAMA3_SPECIALS),
    "mistral": (metaspace(MISTRAL_SPECIALS, "<s>"), "<s>", "</s>", MISTRAL_SPECIALS),
}


def model_dir(name, tok, bos, eos, chat_template=None):
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write(tok.to_str())
    cfg = {"eos_token": eos}
    if bos:
        cfg["bos_token"] = bos
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def ferry_data(d, lines, expect_fail=False):
    path = os.path.join(d, "data.jsonl")
    with open(path, "w") as f:
        for x in lines:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
    p = subprocess.run([args.ferry, "tokenize", "--model", d, "--data", path, "--jsonl"],
                       capture_output=True)
    if expect_fail:
        return p
    if p.returncode != 0:
        print(f"FAIL: ferry tokenize --model {d} --data {path}: "
              f"{p.stderr.decode(errors='replace').strip()}")
        sys.exit(1)
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


tally = Tally(shown=15)
report = tally.report


def mask_from_offsets(enc, ranges):
    """The rule of examples.h in character space: trained iff the token's range is non-empty
    and overlaps one of `ranges`."""
    return [int(a < b and any(a < re and rb < b for rb, re in ranges)) for a, b in enc.offsets]


# ---- 1. prompt/completion across the boundary ------------------------------------------------
def boundary_kind(p, c):
    if not p or not c:
        return "empty side"
    a, b = p[-1], c[0]
    if any(p.endswith(s) for s in ALL_SPECIALS) or any(c.startswith(s) for s in ALL_SPECIALS):
        return "next to a special token"
    if a.isspace() or b.isspace():
        return "at whitespace"
    if ord(a) > 127 and ord(b) > 127:
        return "between multi-byte characters"
    if a.isalnum() and b.isalnum():
        return "inside a word"
    return "other"


ALL_SPECIALS = sorted({s for v in TOKENIZERS.values() for s in v[3]})
kinds = {}


def check_boundary(name, tok, bos, eos, specials):
    d = model_dir(name + "-pc", tok, bos, eos)
    pairs = []
    for i in range(args.cases):
        s = text(specials + ["[INST]"], n=rng.randint(1, 10))
        cut = rng.randint(0, len(s))
        if i % 4 == 0 and s:  # aim at the interesting places
            spots = [k for k in range(1, len(s)) if s[k - 1].isalnum() and s[k].isalnum()]
            if spots:
                cut = rng.choice(spots)
        pairs.append((s[:cut], s[cut:]))
    pairs += [("", "x"), ("x", ""), ("", ""), ("a" * 3, "b" * 3), ("中文", "字符"), ("Hello", " world"),
              ("Hello ", "world"), ("foo" + eos, "bar"), ("foo", eos), ("x", "\n\n")]
    got = ferry_data(d, [{"prompt": p, "completion": c} for p, c in pairs])
    eos_id = tok.token_to_id(eos)
    for (p, c), g in zip(pairs, got):
        tally.compared += 1
        kinds[boundary_kind(p, c)] = kinds.get(boundary_kind(p, c), 0) + 1
        enc = tok.encode(p + c, add_special_tokens=True)
        ids = list(enc.ids)
        mask = mask_from_offsets(enc, [(len(p), len(p) + len(c))])
        if not ids or ids[-1] != eos_id:
            ids.append(eos_id)
            mask.append(1)
        if g["ids"] != ids:
            report("ids", name, (p, c), ids, g["ids"])
        elif g["trained"] != mask:
            report("mask", name, (p, c), mask, g["trained"])
    print(f"{name}: {len(pairs)} prompt/completion pairs compared with tokenizers")


# ---- 2. chat templates -----------------------------------------------------------------------
def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=[jinja2.ext.loopcontrols])
ENV.globals["raise_exception"] = raise_exception
# transformers' own `tojson` (chat_template_utils.py): json.dumps, no HTML escaping, keys in order.
ENV.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
    sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                separators=separators, sort_keys=sort_keys)


def load_template(fn):
    with open(os.path.join(HERE, "chat_templates", fn)) as f:
        return f.read()


def render(tmpl, messages, bos, eos, add_generation_prompt=False, **extra):
    return tmpl.render(messages=messages, bos_token=bos or "", eos_token=eos,
                       add_generation_prompt=add_generation_prompt, **extra)


def content():
    s = text()
    r = rng.random()
    if r < 0.2:
        s = rng.choice(SPACE) + s + rng.choice(SPACE)
    elif r < 0.3:
        s = "\u3000" + s + "\u00a0\n"
    return s


def conversation(with_system, family=None):
    msgs = []
    if with_system:
        msgs.append({"role": "system", "content": content()})
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": content()})
        msgs.append({"role": "assistant", "content": content()})
        if family == "qwen3":
            think(msgs[-1])
            if rng.random() < 0.15:  # a tool's response is not a user query
                msgs.append({"role": "user",
                             "content": "<tool_response>" + text() + "</tool_response>"})
                msgs.append({"role": "assistant", "content": content()})
                think(msgs[-1])
    if rng.random() < 0.1:
        msgs.pop()  # ends with a user turn
    return msgs


def think(m):
    """Qwen3's reasoning, in the ways a dataset gives it: none, a <think> block in the content
    (with the newlines around it varied, empty or not), or a separate reasoning_content."""
    r = rng.random()
    nl = lambda: rng.choice(["", "\n", "\n\n"])
    if r < 0.4:
        m["content"] = ("<think>" + nl() + rng.choice(["", text()]) + nl() + "</think>" + nl() +
                        m["content"])
    elif r < 0.55:
        m["reasoning_content"] = rng.choice(["", "\n", text(), "\n" + text() + "\n"])


MARKER = {"chatml": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>"}


def qwen3_ranges(full, msgs):
    """Qwen3 renders a turn differently once a user query follows it, so its turns are found in
    the whole conversation: each assistant turn's answer and <|im_end|>, and its <think> block
    when the block holds reasoning (an empty one is context, as in the enable_thinking=False
    prompt)."""
    ranges, at = [], 0
    header, open_, close = "<|im_start|>assistant\n", "<think>\n", "\n</think>\n\n"
    for m in msgs:
        if m["role"] != "assistant":
            continue
        at = full.index(header, at) + len(header)
        end = full.index("<|im_end|>", at) + len("<|im_end|>")
        start = at
        if full.startswith(open_, at):
            shut = full.index(close, at)
            if shut == at + len(open_):  # "<think>\n\n</think>\n\n": nothing thought
                start = shut + len(close)
        ranges.append((start, end))
        at = end
    return ranges


def trained_ranges(tmpl, msgs, bos, eos, family):
    """Each assistant turn's content as the template writes it plus its end-of-turn marker, found
    in what rendering that turn adds to the conversation before it."""
    full = render(tmpl, msgs, bos, eos)
    if family == "qwen3":
        return full, qwen3_ranges(full, msgs)
    ranges = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before, upto = render(tmpl, msgs[:k], bos, eos), render(tmpl, msgs[:k + 1], bos, eos)
        assert upto.startswith(before) and full.startswith(upto), "template is not incremental"
        body = (m["content"].strip() if family == "llama3" else m["content"]) + MARKER[family]
        at = upto.rindex(body, len(before))
        ranges.append((at, at + len(body)))
    return full, ranges


def compare_example(label, fn, case, g, tok, want, ranges):
    """ferry's example `g` (tokenize --data --jsonl) against the rendered text `want`: the text,
    its ids as `tokenizers` encodes it without special tokens, and the mask over `ranges()`
    (called once the text matches); the first difference is reported as `label` + what."""
    if g["text"] != want:
        report(label + "text", fn, case, repr(want), repr(g["text"]))
        return
    enc = tok.encode(want, add_special_tokens=False)
    if g["ids"] != enc.ids:
        report(label + "ids", fn, case, enc.ids, g["ids"])
        return
    mask = mask_from_offsets(enc, ranges())
    if g["trained"] != mask:
        report(label + "mask", fn, case, mask, g["trained"])


CHATS = [("qwen2.5.jinja", "qwen", "chatml"), ("qwen3.jinja", "qwen", "qwen3"),
         ("llama3.jinja", "llama3", "llama3"),
         ("llama3.1.jinja", "llama3", "llama3"), ("mistral-v0.2.jinja", "mistral", "mistral")]


def check_chat(fn, tok_name, family):
    tok, bos, eos, _ = TOKENIZERS[tok_name]
    source = load_template(fn)
    tmpl = ENV.from_string(source)
    d = model_dir("chat-" + fn, tok, bos, eos, chat_template=source)
    convs = [conversation(i % 2 == 0, family) for i in range(args.cases)]
    if family == "qwen3":  # the template's corners that random conversations rarely reach
        convs += [
            [{"role": "assistant", "content": "<think>a</think>b</think>\n\nc"},
             {"role": "user", "content": "q"}],
            [{"role": "user", "content": "q"}, {"role": "system", "content": "late"},
             {"role": "assistant", "content": "x<think>y"}],
            [{"role": "assistant", "content": "only"}],
            [{"role": "user", "content": "<tool_response>r</tool_response>"},
             {"role": "assistant", "content": "<think>\nt\n</think>a", "reasoning_content": None}],
            [{"role": "user", "content": "q"},
             {"role": "assistant", "content": "a", "reasoning_content": "\n"}],
        ]
    got = ferry_data(d, [{"messages": c} for c in convs])
    for c, g in zip(convs, got):
        tally.compared += 1
        want, ranges = trained_ranges(tmpl, c, bos, eos, family)
        compare_example("", fn, c, g, tok, want, lambda: ranges)
    print(f"{fn}: {len(convs)} conversations rendered with jinja2 and compared (text, ids, mask)")


def check_chat_prompt(fn, tok_name, family, thinking=True):
    """`ferry generate --chat`'s prompt (`ferry tokenize --chat --jsonl`: a user turn, after a
    system turn or not) against the template rendered with add_generation_prompt=True, its ids
    against `tokenizers`' encoding without special tokens, and the answer's stop (the template's
    end-of-turn marker) against the tokenizer's id for it."""
    tok, bos, eos, _ = TOKENIZERS[tok_name]
    source = load_template(fn)
    tmpl = ENV.from_string(source)
    d = model_dir("chat-" + fn, tok, bos, eos, chat_template=source)
    cases = []
    for i in range(args.cases // 4):
        case = {"user": content()}
        if i % 2 == 0:  # an empty --system is no system turn: a system turn has text
            case["system"] = content() or "Answer briefly."
        cases.append(case)
    stdin = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    extra = {} if thinking else {"enable_thinking": False}
    p = subprocess.run([args.ferry, "tokenize", "--model", d, "--chat", "--jsonl"] +
                       ([] if thinking else ["--no-thinking"]),
                       input=stdin.encode(), capture_output=True)
    if p.returncode != 0:
        print(f"FAIL: ferry tokenize --model {d} --chat --jsonl: "
              f"{p.stderr.decode(errors='replace').strip()}")
        sys.exit(1)
    got = [json.loads(l) for l in p.stdout.decode().splitlines()]
    stop = tok.token_to_id(MARKER[family])
    for c, g in zip(cases, got):
        tally.compared += 1
        msgs = ([{"role": "system", "content": c["system"]}] if "system" in c else []) + \
            [{"role": "user", "content": c["user"]}]
        want = render(tmpl, msgs, bos, eos, add_generation_prompt=True, **extra)
        if g["text"] != want:
            report("prompt text", fn, msgs, repr(want), repr(g["text"]))
            continue
        ids = tok.encode(want, add_special_tokens=False).ids
        if g["ids"] != ids:
            report("prompt ids", fn, msgs, ids, g["ids"])
            continue
        if g["end_of_turn"] != stop:
            report("end of turn", fn, msgs, stop, g["end_of_turn"])
    if len(got) != len(cases):
        report("prompts", fn, "all", len(cases), len(got))
    print(f"{fn}: {len(cases)} generation prompts rendered with jinja2 and compared "
          f"(text, ids, stop){'' if thinking else ' with enable_thinking=False'}")


def check_refused(fn, tok_name, source=None):
    tok, bos, eos, _ = TOKENIZERS[tok_name]
    d = model_dir("chat-" + fn, tok, bos, eos, chat_template=source or load_template(fn))
    p = ferry_data(d, [{"messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "yo"}]}], expect_fail=True)
    err = p.stderr.decode(errors="replace")
    tally.compared += 1
    if p.returncode == 0 or "--chat-template" not in err:
        report("refusal", fn, "user/assistant", "an error suggesting --chat-template",
               f"exit {p.returncode}: {err.strip()}")
    else:
        print(f"{fn}: refused as expected: {err.strip()}")


def json_value(depth=0):
    """A random JSON value of the kinds tool schemas and arguments hold: nested objects (keys in
    random order), lists, strings with escapes and non-ASCII text, ints, floats over many
    exponents (Python's repr writes them), booleans and null."""
    r = rng.random()
    if depth < 3 and r < 0.25:
        return {rng.choice(["type", "name", "a", "b", "z", "ключ", "x y", "q\"", "n\n"]) +
                str(k): json_value(depth + 1) for k in range(rng.randint(0, 4))}
    if depth < 3 and r < 0.35:
        return [json_value(depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.55:
        return rng.choice(["", "\"quoted\"", "back\\slash", "tab\tnew\nline", "\x01\x1f\x7f",
                           "<tag>&'", "/"]) + text(n=rng.randint(0, 3))
    if r < 0.7:
        return rng.choice([0, 1, -7, 42, 2 ** 53 + 1, -(2 ** 63), 2 ** 64 - 1])
    if r < 0.85:
        return rng.choice([0.0, -0.0, 1.0, 0.1, 1e16, 1e15, 1e-5, 0.0001, 2.5e300, 5e-324,
                           rng.uniform(-1, 1) * 10 ** rng.randint(-12, 22)])
    return rng.choice([True, False, None])


def tool_conversation(family):
    """A chat with tool use as Qwen's templates take it: maybe a system message and a `tools`
    list; user queries each answered directly or by tool calls (in OpenAI's {"type", "function"}
    form or bare, arguments an object or a JSON string, content empty or not, and absent when
    empty but under Qwen3's), one to three
    'tool' results and a final answer. Llama 3.1's (family llama3): one call a message, in
    OpenAI's form (its content the template drops), one or two 'tool' or 'ipython' results (text,
    or a JSON object or array), and
    `tools` listed, `[]` or not given."""
    llama = family == "llama3"
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": content()})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": content()})
        if rng.random() < 0.6:
            calls = []
            for _ in range(1 if llama else rng.randint(1, 3)):
                args = {k: json_value(1) for k in rng.sample(["a", "b", "city", "ω"], rng.randint(0, 3))}
                if rng.random() < 0.3:
                    args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
                name = rng.choice(["add", "get_weather", "search"])
                call = {"name": name, "arguments": args}
                calls.append({"type": "function", "function": call}
                             if llama or rng.random() < 0.7 else call)
            msgs.append({"role": "assistant", "content": "" if rng.random() < 0.6 else content(),
                         "tool_calls": calls})
            if family == "qwen3":
                think(msgs[-1])
            # Some exports leave an empty content out (Qwen3's template fails on that, as on a
            # null one: `'</think>' in message.content`; ferry reads both as empty).
            if family != "qwen3" and msgs[-1]["content"] == "" and rng.random() < 0.3:
                del msgs[-1]["content"]
            for _ in range(rng.randint(1, 2 if llama else 3)):
                result = content()
                if llama and rng.random() < 0.3:  # a result as JSON, which Llama's `tojson` writes
                    result = ({"result": json_value(1)} if rng.random() < 0.7
                              else [json_value(1) for _ in range(rng.randint(0, 3))])
                msgs.append({"role": rng.choice(["tool", "ipython"]) if llama else "tool",
                             "content": result})
        msgs.append({"role": "assistant", "content": content()})
        if family == "qwen3":
            think(msgs[-1])
    line = {"messages": msgs}
    r = rng.random()
    if r < 0.6:
        line["tools"] = [{"type": "function",
                          "function": {"name": rng.choice(["add", "search"]),
                                       "description": text(n=3), "parameters": json_value()}}
                         for _ in range(rng.randint(1, 3))]
    elif llama and r < 0.7:
        line["tools"] = []
    return line


def check_tool_chats(fn, family):
    """Chats with tool use (tool_conversation) rendered by
    the real templates with jinja2 and transformers' `tojson` (json.dumps, ensure_ascii=False):
    ferry's text, ids and mask (each assistant turn after its header: answer or tool calls, and
    the end-of-turn marker) must equal them."""
    llama = family == "llama3"
    tok, bos, eos, _ = TOKENIZERS["llama3" if llama else "qwen"]
    source = load_template(fn)
    tmpl = ENV.from_string(source)
    d = model_dir("tool-chats-" + fn, tok, bos, eos, chat_template=source)
    lines = [tool_conversation(family) for _ in range(args.cases // 2)]
    got = ferry_data(d, lines)
    ranges = llama_ranges if llama else qwen3_ranges
    for line, g in zip(lines, got):
        tally.compared += 1
        want = render(tmpl, line["messages"], bos, eos, tools=line.get("tools"))
        compare_example("tool chat ", fn, line, g, tok, want,
                        lambda: ranges(want, line["messages"]))
    print(f"{fn}: {len(lines)} chats with tool use rendered with jinja2 and compared "
          "(text, ids, mask)")


def llama_ranges(full, msgs):
    """Each assistant turn after its header up to and including <|eot_id|>: its trimmed answer,
    or its one tool call's {"name", "parameters"} JSON."""
    ranges, at = [], 0
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    for m in msgs:
        if m["role"] != "assistant":
            continue
        at = full.index(header, at) + len(header)
        end = full.index("<|eot_id|>", at) + len("<|eot_id|>")
        ranges.append((at, end))
        at = end
    return ranges


TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function",
                             "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object"}}}]


def check_tool_use(fn, tok_name, tool_use, source=None):
    """Lines with tool use: a 'tools' list (and an empty one), an assistant's tool_calls, a 'tool'
    result. ferry renders no tool use: where the template writes it (jinja2's text differs from
    the same chat without it, or has no "tool" turn header) ferry refuses the line naming it, and a
    tool call under every template (one without tool use drops the calls from the turn); where
    the template ignores it, ferry's text equals jinja2's. `tool_use`: None (no tool use),
    "truthy" (Qwen's `if tools`) or "present" (Llama 3.1's `tools is not none`; an altered
    Llama 3.1 template, `source`, since ferry renders Llama 3.1's own)."""
    tok, bos, eos, _ = TOKENIZERS[tok_name]
    source = source or load_template(fn)
    tmpl = ENV.from_string(source)
    d = model_dir("tools-" + fn, tok, bos, eos, chat_template=source)
    ask = [{"role": "user", "content": "2+2?"}]
    plain = ask + [{"role": "assistant", "content": "4"}]
    without = render(tmpl, plain, bos, eos)
    # (what, line, jinja2's text, whether ferry refuses it)
    cases = [("tools", {"messages": plain, "tools": TOOLS},
              render(tmpl, plain, bos, eos, tools=TOOLS), tool_use is not None),
             ("empty tools", {"messages": plain, "tools": []},
              render(tmpl, plain, bos, eos, tools=[]), tool_use == "present"),
             ("tool_calls", {"messages": ask + [TOOL_CALL]},
              render(tmpl, ask + [TOOL_CALL], bos, eos), True)]
    if fn != "mistral-v0.2.jinja":  # its roles are user and assistant only
        result = plain + [{"role": "tool", "content": "5"}]
        cases.append(("tool result", {"messages": result}, render(tmpl, result, bos, eos),
                      tool_use is not None))
    header = "<|start_header_id|>tool" if tok_name == "llama3" else "<|im_start|>tool"
    for what, line, full, refused in cases:
        tally.compared += 1
        # The premise: jinja2 writes what ferry refuses its own way, and ignores what it takes.
        if what == "tool result":
            written = header not in full
        elif what == "tool_calls":
            written = full != render(tmpl, ask + [{"role": "assistant", "content": ""}], bos, eos)
        else:
            written = full != without
        if written != (refused and not (what == "tool_calls" and tool_use is None)):
            report("tool premise", fn, what, f"written by the template: {not written}", full)
        if refused:
            p = ferry_data(d, [line], expect_fail=True)
            err = p.stderr.decode(errors="replace")
            if p.returncode == 0 or "tool" not in err or "data.jsonl:1:" not in err:
                report("tool refusal", fn, what, "an error naming the tool use",
                       f"exit {p.returncode}: {err.strip()}")
        else:
            got = ferry_data(d, [line])
            if got[0]["text"] != full:
                report("tool use ignored", fn, what, full, got[0]["text"])
    print(f"{fn}: {len(cases)} tool-use lines checked ("
          f"{sum(c[3] for c in cases)} to be refused, the rest rendered as jinja2 renders them)")


for name, (tok, bos, eos, specials) in TOKENIZERS.items():
    check_boundary(name, tok, bos, eos, specials)
print("boundaries: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
for fn, tok_name, family in CHATS:
    check_chat(fn, tok_name, family)
    check_chat_prompt(fn, tok_name, family)
    if family == "qwen3":
        check_chat_prompt(fn, tok_name, family, thinking=False)
for fn, tok_name, family in CHATS:
    if tok_name == "qwen":
        check_tool_chats(fn, family)
    elif fn == "llama3.1.jinja":
        check_tool_chats(fn, family)
    else:
        check_tool_use(fn, tok_name, None)
# A Llama 3.1 template whose tool clauses differ (here: the tools indented by 2): refused.
check_tool_use("llama3.1-altered.jinja", "llama3", "present",
               load_template("llama3.1.jinja").replace("tojson(indent=4)", "tojson(indent=2)"))
check_refused("llama2.jinja", "mistral")
check_refused("mistral-v0.3.jinja", "mistral")
# A <think> template that renders otherwise than Qwen3's (here: every turn after the last query
# gets its block only when it has reasoning) is refused, not rendered as Qwen3's.
check_refused("qwen3-altered.jinja", "qwen", load_template("qwen3.jinja").replace(
    "loop.last or (not loop.last and reasoning_content)", "reasoning_content"))
print(f"{tally.compared} comparisons, {tally.mismatches} mismatches "
      f"(tokenizers {tokenizers.__version__}, jinja2 {jinja2.__version__})")
sys.exit(1 if tally.mismatches else 0)
