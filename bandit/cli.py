"""The `specbandit` command: one subcommand per analysis module.

Each module owns its command as a typed function `cli`; its docstring is the help text.
"""
from __future__ import annotations

import typer

from bandit import logs

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Counterfactual analysis of multi-drafter speculative decoding logs.")
app.command("validate")(logs.cli)
from bandit import replay; app.command("replay")(replay.cli)  # noqa: E402
from bandit import ci, selector, breakeven; app.command("ci")(ci.cli); app.command("selector")(selector.cli); app.command("breakeven")(breakeven.cli)  # noqa: E402
from bandit import core; app.command("policies")(core.cli)  # noqa: E402


@app.callback()
def _root() -> None:
    """Counterfactual analysis of multi-drafter speculative decoding logs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
