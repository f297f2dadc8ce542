"""The bounds of sweep.py's options, checked before anything loads: one HarnessError line that names the option.

Every numeric option has a stated range (shown in `python sweep.py --help`, from RANGE below); --device is cpu,
cuda or cuda:N; the settings of the built-in drafter kinds have a type and a range (SETTINGS, checked when
--drafter is parsed), and every setting's number is finite. Torch-free at import: sweep.py's help reads RANGE
in an analysis-only install, and a refusal comes before any model or the tokenizer loads.
In the bottom room (harness/models/) because the decoding engine's RunConfig and the drafter registry check
their inputs against these bounds too; how --shard, --ray and --workers combine is the campaign's
(harness/campaign/campaign.py).
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import re

CORES = os.cpu_count() or 1
SEED_END = 1 << 63  # seeds in [0, 2^63): what torch.manual_seed and every seed of bandit/ take
TEMPERATURE = (1e-6, 100.0)  # a positive temperature (0: greedy); a tinier one overflows logits / T in float32
BOUNDS = {  # option -> (lowest, highest), integers
    "--k": (1, 4095),
    "--max-new-tokens": (1, 1 << 20),
    "--threads": (1, 4 * CORES),  # absent: every core on cpu (shared among shards), torch's own on cuda
    "--limit": (1, 10**9),
    "--live-prompts": (0, 100_000),
    "--calibrate": (0, 100_000),
    "--workers": (0, 4096),
}
RANGE = {  # what --help and a refusal say of each
    **{flag: f"an integer in {lo}..{hi}" for flag, (lo, hi) in BOUNDS.items()},
    "--threads": f"an integer in 1..{4 * CORES} (4 x {CORES} cores)",
    "--temperature": f"0 (greedy) or a number in {TEMPERATURE[0]:g}..{TEMPERATURE[1]:g}",
    "--seed": "an integer in 0..2^63-1",
}
KERNEL_CHOICES = ("default", "auto", "aten", "mkldnn", "compile")  # --kernels (harness/models/kernels.py choose)
DEVICE = re.compile(r"(cpu|cuda(:(0|[1-9][0-9]{0,3}))?)\Z")

# Built-in drafter kinds (harness/drafters/registry.py): setting -> str, or (int | float, lowest, highest). A
# setting not listed is left to the class (an unknown one is refused there); plug-in kinds check their own.
_PATH = {"path": str}
_BATCH = {"batch": (int, 1, 1 << 16)}
# chain drafters: stop after a token whose confidence is below this (harness/drafters/model.py)
_STOP = {"stop_below": (float, 0.0, 1.0)}
SETTINGS = {
    "ngram": {"n_min": (int, 1, 4096), "n_max": (int, 1, 4096), "max_occ": (int, 1, 1 << 20), "rule": str},
    "suffix": {
        **{"rule": str, "corpus": str, "feed": str},
        **{"max_depth": (int, 1, 1024), "max_occ": (int, 1, 1 << 20), "min_score": (float, 0.0, 1.0)},
        **{"spec_factor": (float, 0.0, 1000.0), "spec_offset": (float, -1000.0, 1000.0)},
    },
    "draft": {**_PATH, **_BATCH, **_STOP},
    "layerskip": _STOP,
    "medusa": _PATH,
    "eagle": {**_PATH, **_BATCH, **_STOP},
    "eagle3": {**_PATH, **_BATCH, **_STOP, "tree": (int, 0, 4096), "width": (int, 1, 4096)},
    "dflash": {**_PATH, **_BATCH, "block": (int, 0, 4096)},
    "cascade": {"of": str, "rule": str, "min_conf": (float, 0.0, 1.0)},
}


def fail(msg: str):
    from harness.models.lm import HarnessError  # torch: only when there is something to refuse

    raise HarnessError(msg)  # exit 1, as every other refusal of the sweep's (docs/DESIGN.md, "Errors")


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def integer(flag: str, value, lo: int | None = None, hi: int | None = None) -> None:
    """`value` an integer in [lo, hi] (BOUNDS[flag] by default), else one line naming `flag`."""
    lo, hi = (lo, hi) if lo is not None else BOUNDS[flag]
    if not is_int(value) or not lo <= value <= hi:
        fail(f"{flag} {value}: expected {RANGE.get(flag, f'an integer in {lo}..{hi}')}")


def temperature(value) -> None:
    if not is_number(value) or not (value == 0 or TEMPERATURE[0] <= value <= TEMPERATURE[1]):
        fail(f"--temperature {value}: expected {RANGE['--temperature']}")


def seed(value) -> None:
    if not is_int(value) or not 0 <= value < SEED_END:
        fail(f"--seed {value}: expected {RANGE['--seed']}")


def device(value: str, here: bool = True) -> None:
    """cpu, cuda or cuda:N; `here`: that CUDA device exists on this machine (a Ray worker checks its own host)."""
    if not isinstance(value, str) or not DEVICE.match(value):
        fail(f"--device {value!r}: expected cpu, cuda or cuda:N")
    if value == "cpu" or not here:
        return
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not n:
        fail(f"--device {value}: CUDA is not available on this machine")
    if ":" in value and int(value.split(":")[1]) >= n:
        fail(f"--device {value}: this machine has {n} CUDA device(s): cuda:0..cuda:{n - 1}")


def verify_pad(text: str | None, where: str = "--verify-pad") -> str | None:
    """--verify-pad: "auto", or Q:Q'[,...] with 2 <= Q < Q' <= 4096 (normalised: sorted, no spaces); None, "" and
    "none": no padding (None)."""
    if text is None or text.strip() in ("", "none"):
        return None
    if text.strip() == "auto":
        return "auto"
    table = {}
    for item in filter(None, text.split(",")):
        q, _, to = item.partition(":")
        if not (q.strip().isdigit() and to.strip().isdigit() and 2 <= int(q) < int(to) <= 4096) or int(q) in table:
            fail(f"{where} {text}: {item!r}: expected auto, or Q:Q' with 2 <= Q < Q' <= 4096, each Q once")
        table[int(q)] = int(to)
    return ",".join(f"{q}:{table[q]}" for q in sorted(table)) or None


def pad_of(text: str | None, where: str = "--verify-pad") -> dict[int, int]:
    """A padding table's text (verify_pad's form, not "auto") -> {Q: Q'}; {} for no padding."""
    norm = verify_pad(text, where)
    if norm == "auto":
        fail(f"{where} auto: a table is needed here, not auto")
    return {int(q): int(to) for q, to in (x.split(":") for x in norm.split(","))} if norm else {}


def check(*, k, max_new_tokens, temp, seed_, threads, device_, limit, live_prompts, calibrate, workers, ray) -> None:
    """Every numeric option and the device of a sweep, before anything loads."""
    integer("--k", k)
    integer("--max-new-tokens", max_new_tokens)
    temperature(temp)
    seed(seed_)
    if threads is not None:
        integer("--threads", threads)
    device(device_, here=not ray)
    if limit is not None:
        integer("--limit", limit)
    for flag, v in (("--live-prompts", live_prompts), ("--calibrate", calibrate), ("--workers", workers)):
        integer(flag, v)


def drafter_settings(kind: str, settings: dict, where: str) -> None:
    """The settings of a built-in drafter kind: each of its type and in its range (SETTINGS)."""
    for key, v in settings.items():
        rule = SETTINGS.get(kind, {}).get(key)
        if rule is None or rule is str:
            continue
        typ, lo, hi = rule
        ok = is_int(v) if typ is int else is_number(v)
        if not ok or not lo <= v <= hi:
            what = "an integer" if typ is int else "a number"
            fail(f"{where}: setting {key}={v!r}: expected {what} in {lo}..{hi}")


def policy_settings(cls, settings: dict, where: str) -> None:
    """--policy NAME:k=v: each key a parameter of the policy's constructor, each value of its default's type."""
    params = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for key, v in settings.items():
        p = params.get(key)
        if p is None or p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            fail(f"{where}: unknown setting {key!r}; known: {', '.join(sorted(params)) or 'none'}")
        d = p.default
        if isinstance(d, bool) and not isinstance(v, bool):
            fail(f"{where}: setting {key}={v!r}: must be true or false")
        if (is_int(d) and not is_int(v)) or (isinstance(d, float) and not is_number(v)):
            fail(f"{where}: setting {key}={v!r}: must be {'an integer' if is_int(d) else 'a number'}")
