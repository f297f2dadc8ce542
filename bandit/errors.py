"""One handler at the command-line boundary: bad input ends in one line and a nonzero exit, never a traceback.

Every analysis command (`specbandit <cmd>` and `python bandit/<module>.py`) runs through `boundary`.
What it turns into `error: ...` (exit 1): a located problem in a log (`LogError`, a ValueError),
any other ValueError the analysis raises for input it cannot use (a manifest of the wrong shape, a
table with one workload where two are needed), a file that cannot be read (OSError), input nested
too deeply to parse (RecursionError) and text that is not valid Unicode. A bug in the analysis
itself (any other exception) still shows its traceback: hiding it would turn bugs into messages.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

import typer

HANDLED = (ValueError, KeyError, OSError, RecursionError, UnicodeError)


def message(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "input nested too deeply to read (a JSON value inside thousands of brackets?)"
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}" if e.args else "missing field"
    text = str(e) or type(e).__name__
    return text.encode("utf-8", "backslashreplace").decode("utf-8")   # a lone surrogate cannot crash the print


def boundary(fn: Callable) -> Callable:
    """`fn` (a typer command) with HANDLED errors printed as one line on stderr and exit code 1."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HANDLED as e:
            typer.echo(f"error: {message(e)}", err=True)
            raise typer.Exit(1) from None
    return run


def run(fn: Callable) -> None:
    """`typer.run` of a module's command through the boundary (the `python bandit/<module>.py` entry)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    typer.run(boundary(fn))
