"""One write path: every file a command of bandit/ writes goes through `write_file` (or `write_text`).

A temporary file beside the target opened with O_EXCL | O_NOFOLLOW, then an atomic rename: a reader
never sees half a file, a kill leaves the old file whole, and nothing is written through a symlink
(a symlink standing at the target, dangling or not, is refused). Whether an existing file of other
content may be replaced is the caller's contract (`replace_different`), never a default of the disk.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Callable


def write_file(path: Path, write: Callable, replace_different: bool = True) -> bool:
    """Write a file atomically (a new temp file beside it, then os.replace), never through a symlink.

    `write(f)` writes the content to the binary file f. With `replace_different=False` an existing
    file of other content is kept and FileExistsError raised. Returns False when `path` already held
    the same content. OSError (read-only directory, disk full) propagates, the temp file removed.
    """
    if path.is_symlink():
        raise FileExistsError(errno.EEXIST, "a symlink stands there: not written through", str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        if path.exists() and not replace_different:
            if path.read_bytes() == tmp.read_bytes():
                return False
            raise FileExistsError(errno.EEXIST, "exists with other content", str(path))
        os.replace(tmp, path)  # a symlink put there meanwhile is replaced itself, never written through
        return True
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_text(path: str | Path, text: str, replace_different: bool = True) -> bool:
    """`write_file` of UTF-8 text."""
    return write_file(Path(path), lambda f: f.write(text.encode()), replace_different)
