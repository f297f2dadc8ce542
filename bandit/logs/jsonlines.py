"""A JSONL file's objects, read with the checks every line gets before it is indexed (torch-free).

Each non-blank line must be UTF-8 text, nest at most MAX_DEPTH brackets (counted on the raw line before parsing, so
that a line nested 100,000 deep is one error, never a RecursionError) and be one JSON object; a failure is one error
of the caller's class naming the file and the line. A .gz file is read through gzip.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

MAX_DEPTH = 64  # brackets a line may nest (a prompt needs 3: object, messages, turn)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string literal, its escapes included


def depth(line: str) -> int:
    """The deepest bracket nesting of a JSON line outside its strings (counting stops past MAX_DEPTH)."""
    d = top = 0
    for c in _STRING.sub("", line):
        if c in "[{":
            d += 1
            if d > top:
                top = d
                if top > MAX_DEPTH:
                    break
        elif c in "]}":
            d -= 1
    return top


def parse_object(line: str, where: str, error: type[Exception] = ValueError) -> dict:
    """One line's JSON object, else `error` naming `where` (FILE:LINE)."""
    if depth(line) > MAX_DEPTH:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} brackets")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read") from None
    if not isinstance(obj, dict):
        raise error(f"{where}: expected a JSON object")
    return obj


def read_objects(path: Path, error: type[Exception] = ValueError) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of `path`; `error` naming the file (and line) otherwise."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    try:
        with opener(path, "rb") as fh:
            for ln, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise error(f"{path}:{ln}: not UTF-8 text (byte {e.start + 1} of the line)") from None
                if line.strip():
                    out.append((ln, parse_object(line, f"{path}:{ln}", error)))
    except (OSError, EOFError) as e:  # a corrupt gzip stream, a directory, no permission
        raise error(f"{path}: unreadable ({e.strerror or e})") from None
    return out
