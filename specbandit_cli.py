"""The `specbandit` command: every command of the toolkit, collection and analysis, registered here and nowhere else.

It sits above both packages (docs/DESIGN.md, "Layout"): `bandit/` (analysis) never imports `harness/` or `sweep`,
and this table is the one module that imports both. Each analysis module owns its command as a typed function
`cli` (its docstring is the help text) and keeps `python bandit/<module>.py` working; the collection sweep is
`sweep.py`'s `main` (so `specbandit sweep` and `python sweep.py` are one command). Every command runs through
`bandit.logs.errors.boundary`: bad input is one line on stderr and a nonzero exit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

import sweep
from harness.campaign import merge, outputs
from bandit import __version__, breakeven, ci, core, regret, replay, selector, wallclock
from bandit.live import export
from bandit.logs import reader as logs
from bandit.logs import observed
from bandit.sim import simulate
from bandit.logs.errors import boundary


def convert_checkpoint(
    src: Annotated[
        Path, typer.Argument(help="a .bin/.pt/.pth weight file, a directory of them, or a .gguf model file")
    ],
    dst: Annotated[
        Path,
        typer.Argument(
            help="the directory to write the safetensors (and config.json) into; for a .gguf: the new model directory"
        ),
    ],
) -> None:
    """Convert pickled head weights (EAGLE's pytorch_model.bin, Medusa's medusa_lm_head.pt) to safetensors, once.

    The one step that unpickles (torch.load with weights_only=True); the sweep reads safetensors only. SRC's
    config.json is copied to DST; nothing is overwritten. Then pass DST as the drafter's path=.

    A .gguf SRC (a quantized model file) is dequantized to a float32 safetensors model directory DST with its
    tokenizer, chat template and conversion.json (harness/models/gguf.py; needs the smollm2 extra). DST must not
    exist, unless it is a complete conversion of the same file (then nothing is done). Then pass DST as --target.
    """
    if str(src).lower().endswith(".gguf"):
        from harness.models import gguf  # torch and transformers: imported only when this command runs

        gguf.convert_cli(src, dst)
        return
    from harness.models import convert  # torch: imported only when this command runs (the analysis install has none)

    convert.cli(src, dst)


COMMANDS = (  # name, the function, and what it is for (the first line of its help)
    ("sweep", sweep.main),  # collect block logs: every drafter drafts from the identical prefix
    ("merge", merge.merge),  # shards or runs of one campaign -> one campaign directory
    ("validate", logs.cli),  # check logs: one summary line, or the first located error
    ("pack", logs.pack),  # JSONL logs -> blocks_*.parquet that every command reads
    ("replay", replay.cli),  # mean accepted table, oracles, trajectories
    ("ci", ci.cli),  # every headline number with a 95% CI -> ci.json
    ("selector", selector.cli),  # the leave-one-workload-out selector
    ("breakeven", breakeven.cli),  # wall-clock break-even of re-drafting
    ("wallclock", wallclock.cli),  # the timing model against the live phase
    ("policies", core.cli),  # every drafter-selection policy replayed
    ("simulate", simulate.cli),  # a simulated campaign [SIM]
    ("import-vllm", observed.import_vllm_cli),  # vLLM's spec-decode counters -> an observed-only record
    ("export", export.cli),  # live configurations as vLLM/llama.cpp metrics or a Spec-Bench-style table
    ("regret", regret.main),  # every policy and engine rule against the best fixed drafter and the per-block oracle
    ("convert-checkpoint", convert_checkpoint),  # pickled head weights or a GGUF -> safetensors, once
    ("outputs", outputs.cli),  # a run's outputs.jsonl: rebuild it for a run from before it, or --check it
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Counterfactual analysis of multi-drafter speculative decoding logs.",
)
for name, fn in COMMANDS:
    app.command(name, help=fn.__doc__ or sys.modules[fn.__module__].__doc__)(boundary(fn))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specbandit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Counterfactual analysis of multi-drafter speculative decoding logs."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
