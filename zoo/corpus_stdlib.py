"""The corpus's code, prose and docstring chat items, from the running interpreter's standard library.

``code``: the stdlib's ``.py`` source (top-level modules and the packages of ``CODE_PACKAGES``) chunked at
top-level ``def``/``class`` boundaries; ``prose``: module docstrings and CPython's ``pydoc_data`` topics;
``chat``: questions about stdlib functions answered by their docstrings and about pydoc topics. The split
follows the stdlib file or the pydoc topic (zoo/corpus.py describes the sources and their licences).
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

from .corpus_base import Item, render_chat, rng_for, split_of

# stdlib sub-packages used in addition to the top-level modules
CODE_PACKAGES = (
    "json",
    "collections",
    "logging",
    "urllib",
    "http",
    "email",
    "concurrent",
    "importlib",
    "asyncio",
    "html",
    "xml/dom",
    "wsgiref",
    "sqlite3",
    "tomllib",
    "zoneinfo",
    "unittest",
    "re",
)
MAX_FILE_CHARS = 80_000  # keep any one huge file from dominating
MAX_CHUNK_LINES = 40


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[tuple[str, Path]]:
    root = stdlib_dir()
    files = [p for p in root.glob("*.py") if not p.name.startswith("__")]
    for pkg in CODE_PACKAGES:
        files += [p for p in (root / pkg).glob("*.py")]
    out = sorted({(p.relative_to(root).as_posix(), p) for p in files if p.is_file()})
    return [(rel, p) for rel, p in out if "test" not in rel.split("/")[0]]


def _chunks(src: str) -> list[str]:
    """Split a module at top-level statement boundaries into chunks of <= MAX_CHUNK_LINES."""
    lines = src.splitlines()
    try:
        tree = ast.parse(src)
        starts = sorted({n.lineno - 1 - len(getattr(n, "decorator_list", []) or []) for n in tree.body})
    except SyntaxError:
        starts = list(range(0, len(lines), MAX_CHUNK_LINES))
    starts = [0] + [s for s in starts if s > 0] + [len(lines)]
    chunks, cur = [], []
    for a, b in zip(starts, starts[1:]):
        seg = lines[a:b]
        if cur and len(cur) + len(seg) > MAX_CHUNK_LINES:
            chunks.append(cur)
            cur = []
        while len(seg) > MAX_CHUNK_LINES:
            chunks.append(seg[:MAX_CHUNK_LINES])
            seg = seg[MAX_CHUNK_LINES:]
        cur += seg
    if cur:
        chunks.append(cur)
    return ["\n".join(c).strip("\n") + "\n" for c in chunks if "".join(c).strip()]


def _defs_with_docstrings(tree, modname):
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and 40 <= len(doc) <= 1200:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                out.append((f"{modname}.{node.name}", kind, doc))
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                        d = ast.get_docstring(sub)
                        if d and 40 <= len(d) <= 1200:
                            out.append((f"{modname}.{node.name}.{sub.name}", "method", d))
    return out


def code_prose_chat_items(seed: int):
    rng = rng_for(seed, "chat-doc")
    code, prose, chat, code_chunks = [], [], [], []
    for rel, path in stdlib_files():
        try:
            src = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        src = src[:MAX_FILE_CHARS]
        split = split_of("stdlib:" + rel)
        modname = rel[:-3].replace("/", ".").removesuffix(".__init__")
        for i, ch in enumerate(_chunks(src)):
            text = f"# {rel}\n{ch}"
            code.append(Item("code", split, f"code:{rel}:{i}", text))
            code_chunks.append((split, rel, i, ch))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        mdoc = ast.get_docstring(tree)
        if mdoc and len(mdoc) > 80:
            prose.append(Item("prose", split, f"prose:mod:{rel}", f"Module {modname}\n\n{mdoc}\n"))
        for j, (name, kind, doc) in enumerate(_defs_with_docstrings(tree, modname)):
            q = rng.choice(
                [
                    f"What does the {kind} `{name}` do?",
                    f"Explain `{name}` from the Python standard library.",
                    f"How do I use `{name}`?",
                    f"Can you describe the {kind} {name}?",
                ]
            )
            msgs = ((("user", q)),)
            full = render_chat(list(msgs) + [("assistant", doc)])
            chat.append(Item("chat", split, f"chat:doc:{name}", full, render_chat(msgs, True), msgs))
    # pydoc topics
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover
        topics = {}
    for key in sorted(topics):
        body = topics[key].strip()
        split = split_of("topic:" + key)
        paras = [p for p in body.split("\n\n") if p.strip()]
        # topic text as prose, in pieces of a few paragraphs
        for i in range(0, len(paras), 6):
            text = "\n\n".join(paras[i : i + 6]) + "\n"
            prose.append(Item("prose", split, f"prose:topic:{key}:{i}", text))
        # chat turns: question about the topic, answered by its first paragraphs
        label = key.replace("-", " ")
        answer = ""
        for p in paras:
            if len(answer) + len(p) > 900:
                break
            answer += p + "\n\n"
        answer = answer.strip() or paras[0][:900]
        for q in (f"What is {label} in Python?", f"Tell me about {label}.", f"Explain the Python topic '{label}'."):
            msgs = (("user", q),)
            chat.append(
                Item(
                    "chat",
                    split,
                    f"chat:topic:{key}:{q}",
                    render_chat(list(msgs) + [("assistant", answer)]),
                    render_chat(msgs, True),
                    msgs,
                )
            )
    return code, prose, chat, code_chunks
