"""Observed-only records of a production engine: vLLM's spec-decode counters, kept beside (never as) block logs.

A block log holds every drafter's draft at each position, verified against the target, so that the analysis can
ask what another drafter or policy would have done there. An engine's counters hold only what its one drafter
did along its own trajectory: drafts, draft tokens and accepted tokens per position, summed. They can be
reported ([MEASURED], the engine named), never replayed: `refuse_counterfactual` says so in one line.

    import_vllm(metrics_json, out_dir, {"engine": "vllm 0.32.0 cpu", "method": "ngram", "k": 4, ...})
    summarize_observed(out_dir / "observed_vllm.json")

The input is vLLM's metrics in any of the forms it is found in:
* a JSON object of counters, keyed by their names with or without the "vllm:spec_decode_" prefix (and a
  "_total" suffix): num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos (a list);
* such an object under "metrics" (bench/vllm_crosscheck.py --json writes one), or a list of {"name",
  "value" | "values"} (`LLM.get_metrics()` dumped);
* Prometheus text from a server's /metrics (per-position counts labelled position="0", ...; summed over
  labels such as engine or model_name).

The file written, observed_vllm.json:
    {"v": 1, "kind": "observed", "label": "MEASURED", "counterfactual": false, "engine": "vllm 0.32.0 cpu",
     "settings": {...}, "source": "<input path>", "num_drafts": N, "num_draft_tokens": T,
     "num_accepted_tokens": A, "accepted_per_pos": [a1, a2, ...]}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer

from bandit.errors import InputError, boundary
from bandit.schema import SCHEMA_VERSION

OBSERVED_NAME = "observed_vllm.json"
PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
_PROM = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def _short(name: str) -> str:
    return name.removeprefix(PREFIX).removesuffix("_total")


def _from_prometheus(text: str) -> dict:
    """Counters from Prometheus text; the per-position counter by its `position` label."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _PROM.match(line.strip())
        if not m or not m["name"].startswith(PREFIX):
            continue
        name, value = _short(m["name"]), float(m["value"])
        if name == PER_POS:
            pos = re.search(r'position="(\d+)"', m["labels"] or "")
            if pos:
                per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0.0) + value
        elif name in COUNTERS:
            out[name] = out.get(name, 0.0) + value
    if per_pos:
        out[PER_POS] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)]
    return out


def _from_json(obj) -> dict:
    if isinstance(obj, dict) and isinstance(obj.get("metrics"), (dict, list)):
        obj = obj["metrics"]
    if isinstance(obj, list):  # LLM.get_metrics() dumped: [{"name", "value" | "values"}, ...]
        obj = {m["name"]: m.get("values", m.get("value")) for m in obj if isinstance(m, dict) and "name" in m}
    if not isinstance(obj, dict):
        raise InputError("vLLM metrics: expected a JSON object of counters, or a list of {name, value}")
    return {_short(k): v for k, v in obj.items() if _short(k) in COUNTERS + (PER_POS,)}


def read_vllm_metrics(path: str | Path) -> dict:
    """{num_drafts, num_draft_tokens, num_accepted_tokens (ints), accepted_per_pos (list)} from `path`."""
    text = Path(path).read_text()
    try:
        raw = _from_json(json.loads(text))
    except json.JSONDecodeError:
        raw = _from_prometheus(text)
    missing = [c for c in COUNTERS + (PER_POS,) if c not in raw]
    if missing:
        raise InputError(f"{path}: no vLLM spec-decode counter {PREFIX}{missing[0]} (was speculative decoding on?)")
    out = {c: _count(path, c, raw[c]) for c in COUNTERS}
    per = raw[PER_POS]
    if not isinstance(per, list):
        raise InputError(f"{path}: {PREFIX}{PER_POS} must be a list of counts by position")
    out["accepted_per_pos"] = [_count(path, f"{PER_POS}[{i}]", v) for i, v in enumerate(per)]
    _check(path, out)
    return out


def _count(path, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise InputError(f"{path}: {PREFIX}{name} = {v!r} is not a count")
    return int(v)


def _check(path, m: dict) -> None:
    """The counters' own identities: per-position counts fall with position, sum to the accepted tokens, and
    no position is accepted by more drafts than there are."""
    per = m["accepted_per_pos"]
    if any(b > a for a, b in zip(per, per[1:])) or (per and per[0] > m["num_drafts"]):
        raise InputError(f"{path}: accepted tokens per position must not rise with position nor exceed the drafts")
    if sum(per) != m["num_accepted_tokens"]:
        raise InputError(f"{path}: accepted tokens per position sum to {sum(per)}, not {m['num_accepted_tokens']}")
    if m["num_accepted_tokens"] > m["num_draft_tokens"]:
        raise InputError(f"{path}: more accepted tokens than draft tokens")


def import_vllm(metrics_json: str | Path, out_dir: str | Path, manifest_fields: dict) -> Path:
    """Write out_dir/observed_vllm.json from vLLM's spec-decode metrics; `manifest_fields` must name the engine
    (e.g. "vllm 0.32.0 cpu") and may carry settings (method, k, prompt_lookup_min/max, target, hardware)."""
    fields = dict(manifest_fields)
    engine = fields.pop("engine", None)
    if not engine:
        raise InputError("import-vllm: name the engine (e.g. engine='vllm 0.32.0 cpu'): observed figures are its")
    m = read_vllm_metrics(metrics_json)
    rec = {"v": SCHEMA_VERSION, "kind": "observed", "label": "MEASURED", "counterfactual": False, "engine": engine}
    rec |= {"settings": fields, "source": str(metrics_json)} | m
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / OBSERVED_NAME
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def is_observed(path: str | Path) -> bool:
    """`path` is an observed-only record (observed_vllm.json), or a directory holding one and no block log."""
    p = Path(path)
    if p.is_dir():
        return (p / OBSERVED_NAME).is_file() and not any(p.rglob("blocks_*"))
    return p.name == OBSERVED_NAME and p.is_file()


def load_observed(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / OBSERVED_NAME
    rec = json.loads(p.read_text())
    if not isinstance(rec, dict) or rec.get("kind") != "observed":
        raise InputError(f"{p}: not an observed-only engine record (kind 'observed')")
    return rec


def summarize_observed(path: str | Path) -> str:
    """Acceptance by position, mean accepted length and tokens per drafted step; printed and returned."""
    r = load_observed(path)
    n, per = r["num_drafts"], r["accepted_per_pos"]
    if not n:
        raise InputError(f"{path}: no drafts were counted")
    mean = r["num_accepted_tokens"] / n
    lines = [f"[MEASURED] {r['engine']} (observed only: its own drafter along its own trajectory; no counterfactual)"]
    lines.append(f"  settings: {json.dumps(r.get('settings', {}), sort_keys=True)}")
    lines.append(f"  drafts {n}, draft tokens {r['num_draft_tokens']} ({r['num_draft_tokens'] / n:.3f} per draft)")
    lines += [f"  acc[{j + 1}] = {c / n:.4f}  (drafts accepting >= {j + 1}: {c})" for j, c in enumerate(per)]
    lines.append(f"  mean accepted length {mean:.4f}; tokens per drafted step {1 + mean:.4f}")
    lines.append(f"  draft-token acceptance rate {r['num_accepted_tokens'] / max(r['num_draft_tokens'], 1):.4f}")
    text = "\n".join(lines)
    print(text)
    return text


def refuse_counterfactual(path: str | Path) -> None:
    """Every counterfactual statistic (replay, oracle, policy, breakeven on acceptance) asks what unchosen drafts
    would have done: an engine's counters never verified any. Always raises InputError."""
    engine = load_observed(path).get("engine", "an engine")
    raise InputError(
        f"{path}: observed-only counters of {engine} (one drafter, its own trajectory): no counterfactual "
        "statistic can be computed on them; collect a dense block log with sweep.py for that"
    )


def _settings(pairs: list[str]) -> dict:
    out: dict = {}
    for s in pairs:
        key, eq, value = s.partition("=")
        if not eq or not key:
            raise InputError(f"--set {s!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@boundary
def import_vllm_cli(
    metrics: str = typer.Argument(
        ..., help="vLLM metrics: JSON (counters or LLM.get_metrics() dumped) or /metrics text"
    ),
    out: str = typer.Option(..., "--out", help="directory for observed_vllm.json"),
    engine: str = typer.Option(..., "--engine", help="the engine and build, e.g. 'vllm 0.32.0 cpu'"),
    settings: list[str] = typer.Option([], "--set", help="KEY=VALUE engine setting (method=ngram, k=4, ...)"),
) -> None:
    """Import vLLM's spec-decode counters as an observed-only record (not a block log) and print its summary.

    The counters (drafts, draft tokens, accepted tokens per position) are what vLLM's one drafter did along its own
    trajectory: they are reported [MEASURED] with the engine named; replay, oracles and policies refuse them.
    """
    path = import_vllm(metrics, out, {"engine": engine} | _settings(settings))
    summarize_observed(path)
    typer.echo(f"observed record: {path}")
