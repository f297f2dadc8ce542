"""Progress bars for analysis steps longer than a few seconds: tqdm on stderr, off when stderr is not a
terminal or after `quiet()` (the commands' --quiet). Never on stdout, so outputs stay byte-identical."""

from __future__ import annotations

import sys

_QUIET = False


def quiet(on: bool = True) -> None:
    global _QUIET
    _QUIET = on


def bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True, disable=True if _QUIET else None
    )
