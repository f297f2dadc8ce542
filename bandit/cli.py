"""The `specbandit` command: one subcommand per analysis module.

Each module owns its command as a typed function `cli`; its docstring is the help text.
"""
from __future__ import annotations

import typer

from bandit import __version__, breakeven, ci, core, logs, replay, selector, wallclock
from bandit.errors import boundary

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Counterfactual analysis of multi-drafter speculative decoding logs.")
for name, module in (("validate", logs), ("replay", replay), ("ci", ci), ("selector", selector),
                     ("breakeven", breakeven), ("wallclock", wallclock), ("policies", core)):
    app.command(name)(boundary(module.cli))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specbandit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Counterfactual analysis of multi-drafter speculative decoding logs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
