"""The `specbandit` command: one subcommand per analysis module.

Each module owns its command as a typed function `cli`; its docstring is the help text.
"""
from __future__ import annotations

import typer

from bandit import breakeven, ci, core, logs, replay, selector

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Counterfactual analysis of multi-drafter speculative decoding logs.")
for name, module in (("validate", logs), ("replay", replay), ("ci", ci), ("selector", selector),
                     ("breakeven", breakeven), ("policies", core)):
    app.command(name)(module.cli)


@app.callback()
def _root() -> None:
    """Counterfactual analysis of multi-drafter speculative decoding logs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
