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
"""

from __future__ import annotations

import gzip
import json
import keyword
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

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
SPECBENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
COPYEDIT_LINES = 40  # lines per copy/edit chunk
_RESERVED = set(keyword.kwlist) | {
    "self",
    "print",
    "return",
    "const",
    "function",
    "while",
    "static",
    "public",
    "void",
    "char",
    "struct",
    "include",
    "define",
    "else",
    "true",
    "false",
    "null",
}


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
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{path}:{ln}: not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"{path}:{ln}: expected a JSON object")
            out.append((ln, obj))
    return out


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
        if not isinstance(pid, (str, int)) or pid == "":
            raise WorkloadError(f"{where}: prompt_id: missing")
        pid = str(pid)
        has_p, has_m = isinstance(obj.get("prompt"), str), isinstance(obj.get("messages"), list)
        if has_p == has_m:
            raise WorkloadError(f"{where}: need exactly one of prompt (text) or messages (list of turns)")
        if has_m and not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in obj["messages"]):
            raise WorkloadError(f"{where}: messages: each turn needs role and content")
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
    where = ", ".join(map(str, tried)) or "nowhere: no data root (--data, $SPECBANDIT_DATA, --models/$MACH_MODELS)"
    raise WorkloadError(
        f"workload {name}: benchmark file {rel} not found; looked in: {where}; or give --workload-path {name}=FILE"
    )


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
    if base not in BENCH_FILES:
        raise WorkloadError(
            f"unknown workload {name!r}; known: {', '.join(CPU_WORKLOADS + tuple(BENCH_FILES))}"
            " (specbench:CATEGORY filters Spec-Bench), or use --workload-file"
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
