"""One base class for problems in what a user gave us, and one handler at the command-line boundary.

`InputError` is the base of every located input problem: a log (`bandit.logs.reader.LogError`), a manifest,
a calibration file, a workload file, a checkpoint or a command-line setting (`harness.models.lm.HarnessError`).
Every command (`specbandit <cmd>`, `python bandit/<module>.py`, `python sweep.py`) runs through
`boundary`, which prints such a problem as one line `error: ...` on stderr and exits with the code
below. A bug in the code itself (any other exception) still shows its traceback: hiding it would
turn bugs into messages.

Exit codes: 1 for an input problem (`InputError`, and the ValueErrors numpy/scipy raise on input
they cannot use); 2 for a usage error (typer's own, and `UsageError`: an option's value outside the
range its --help states, said in one line naming the option); 3 for a file that cannot be read or
written (OSError: missing, permission denied, disk full, a symlink where an output goes). A report
computed whole whose file cannot be written is printed before the error line (`report` on the error).
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer

EXIT_INPUT = 1  # the input is wrong: fix it and run again
EXIT_USAGE = 2  # an option out of its range: read --help
EXIT_IO = 3  # the file system refused: a path, a permission, a full disk


class InputError(ValueError):
    """A problem in the user's input, said in one line that names where (a path, a line, a field)."""


class UsageError(InputError):
    """An option's value out of its stated range (or two options that exclude each other): exit 2, as typer's own."""


# What `boundary` turns into one line. KeyError and ValueError: a field missing, or a value an
# analysis cannot use, found below the checks; RecursionError: input nested too deeply to parse;
# UnicodeError: a name that is not valid Unicode.
HANDLED = (InputError, ValueError, KeyError, RecursionError, UnicodeError, OSError)


def message(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "input nested too deeply to read (a JSON value inside thousands of brackets?)"
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}" if e.args else "missing field"
    text = str(e) or type(e).__name__
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate cannot crash the print


def exit_code(e: BaseException) -> int:
    return EXIT_IO if isinstance(e, OSError) else EXIT_USAGE if isinstance(e, UsageError) else EXIT_INPUT


def boundary(fn: Callable) -> Callable:
    """`fn` (a typer command) with HANDLED errors printed as one line on stderr and their exit code."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        for stream in (sys.stdout, sys.stderr):  # a path with a non-UTF-8 byte (a surrogate escape) is printed
            if hasattr(stream, "reconfigure"):  # escaped, not turned into an error
                stream.reconfigure(errors="backslashreplace")
        try:
            return fn(*args, **kwargs)
        except HANDLED as e:
            report = getattr(e, "report", None)  # a report computed whole, its file unwritten: printed first
            if report:
                typer.echo(report, nl=False)
            typer.echo(f"error: {message(e)}", err=True)
            raise typer.Exit(exit_code(e)) from None

    return run


def run(fn: Callable) -> None:
    """`typer.run` of a module's command through the boundary (the `python bandit/<module>.py` entry)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    typer.run(boundary(fn))


def guarded(main: Callable[[], int | None]) -> None:
    """An argparse script's `main()` through the boundary (paper/build.py, bench/coverage.py): exits with its
    return value, or one line and the code above for a HANDLED error."""
    try:
        code = boundary(main)()
    except typer.Exit as e:
        code = e.exit_code
    sys.exit(code if isinstance(code, int) else 0)
