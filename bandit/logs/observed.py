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

The end effect (`--outputs`, ngram only). vLLM drafts k tokens up to max_model_len, never cut at max_tokens, and
counts the last step's accepted tokens before the output is cut at max_tokens (or after an EOS): its counters hold
drafts and acceptance past the returned output, which a block log (drafts cut to the budget, acceptance within the
output) never has. Given the requests' prompts and outputs (JSON lines {"prompt_token_ids", "output_token_ids",
"max_tokens"}, optionally "steps": [[drafted, accepted], ...] from per_request_spec_decode_metrics="detailed";
bench/vllm_crosscheck.py --outputs-out writes them) and the settings (method=ngram, k, prompt_lookup_min,
prompt_lookup_max), `end_correction` replays vLLM's ngram proposer along each output from position 1 (after the
prefill's token): the drafts and draft tokens vLLM counted must come out exactly, and the accepted tokens up to the
last step's unknown run past the end; the record then holds the counts *within the output* (each draft cut to
max_tokens - 1 - pos, acceptance within the output) and keeps vLLM's own under "as_counted", the difference under
"post_end". Other methods' drafts cannot be recomputed from outputs: refused.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import typer

from bandit.logs.errors import InputError, boundary
from bandit.logs.safeio import write_text
from bandit.logs.schema import SCHEMA_VERSION, common_prefix

OBSERVED_NAME = "observed_vllm.json"
PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
MAX_POS = 64  # draft positions an engine counts; a label beyond it is a damaged or hostile input, not a draft
_PROM = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def _short(name: str) -> str:
    return name.removeprefix(PREFIX).removesuffix("_total")


def _from_prometheus(text: str) -> dict:
    """Counters from Prometheus text, summed over labels such as engine or model_name; the per-position counter
    by its `position` label (at most MAX_POS; the same labels twice is refused, not summed)."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    seen: set[tuple[str, str]] = set()
    for i, line in enumerate(text.splitlines(), 1):
        m = _PROM.match(line.strip())
        if not m or not m["name"].startswith(PREFIX):
            continue
        name = _short(m["name"])
        if name not in COUNTERS + (PER_POS,):
            continue
        if (m["name"], m["labels"] or "") in seen:
            raise InputError(f"line {i}: {m['name']}{{{m['labels'] or ''}}} a second time")
        seen.add((m["name"], m["labels"] or ""))
        try:
            value = float(m["value"])
        except ValueError:
            raise InputError(f"line {i}: {m['name']} = {m['value']!r} is not a number") from None
        if name == PER_POS:
            pos = re.search(r'position="(\d{1,9})"', m["labels"] or "")
            if not pos or int(pos[1]) >= MAX_POS:
                raise InputError(f"line {i}: {m['name']} needs a position label in 0..{MAX_POS - 1}")
            per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0.0) + value
        else:
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
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    try:
        raw = _from_json(json.loads(text))
    except json.JSONDecodeError:
        try:
            raw = _from_prometheus(text)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None
    return counters(path, raw)


def counters(path, raw: dict) -> dict:
    """The checked counters of `raw` (read from vLLM, or an observed record read back): finite integer counts,
    at most MAX_POS positions, and the counters' own identities (`_check`)."""
    missing = [c for c in COUNTERS + (PER_POS,) if c not in raw]
    if missing:
        raise InputError(f"{path}: no vLLM spec-decode counter {PREFIX}{missing[0]} (was speculative decoding on?)")
    out = {c: _count(path, c, raw[c]) for c in COUNTERS}
    per = raw[PER_POS]
    if not isinstance(per, list) or len(per) > MAX_POS:
        raise InputError(f"{path}: {PREFIX}{PER_POS} must be a list of counts by position (at most {MAX_POS})")
    out["accepted_per_pos"] = [_count(path, f"{PER_POS}[{i}]", v) for i, v in enumerate(per)]
    _check(path, out)
    return out


def _count(path, name: str, v) -> int:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 2**63
    if not ok or v != int(v):
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


MAX_TOKENS_PER_REQUEST = 1 << 20  # prompt or output tokens on one line of --outputs: beyond, a damaged input


def _ngram_draft(ctx: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """vLLM 0.32's ngram proposal: the longest suffix n-gram (n_max down to n_min) that occurs earlier, its
    earliest occurrence, and at most k of the tokens that exist after it (the vllm tier checks this rule against
    vLLM's own proposer, through bench/vllm_walk.py's equal copy)."""
    P = len(ctx)
    for n in range(min(n_max, P - 1), n_min - 1, -1):
        win = np.lib.stride_tricks.sliding_window_view(ctx[: P - 1], n)
        hits = np.flatnonzero((win == ctx[P - n :]).all(1))
        if len(hits):
            src = int(hits[0]) + n
            return ctx[src : min(P, src + k)].tolist()
    return []


def _ids(where: str, v) -> list[int]:
    ok = isinstance(v, list) and len(v) <= MAX_TOKENS_PER_REQUEST
    if not ok or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in v):
        raise InputError(f"{where}: expected a list of token ids")
    return v


def _read_outputs(path: str | Path) -> list[dict]:
    reqs = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--outputs {path}: cannot read it as UTF-8 text ({e})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(f"{path}:{i}: not a JSON object") from None
        if not isinstance(r, dict):
            raise InputError(f"{path}:{i}: not a JSON object")
        M = r.get("max_tokens")
        if not isinstance(M, int) or isinstance(M, bool) or not 1 <= M <= MAX_TOKENS_PER_REQUEST:
            raise InputError(f"{path}:{i}: max_tokens must be a positive integer")
        req = {"prompt": _ids(f"{path}:{i}: prompt_token_ids", r.get("prompt_token_ids"))}
        req["output"] = _ids(f"{path}:{i}: output_token_ids", r.get("output_token_ids"))
        if not req["prompt"] or len(req["output"]) > M:
            raise InputError(f"{path}:{i}: an empty prompt, or an output longer than max_tokens")
        steps = r.get("steps")
        if steps is not None:
            if not isinstance(steps, list) or not all(isinstance(s, list) and len(s) == 2 for s in steps):
                raise InputError(f"{path}:{i}: steps must be [[drafted, accepted], ...]")
            steps = [tuple(_ids(f"{path}:{i}: steps", s)) for s in steps]
        reqs.append(req | {"max_tokens": M, "steps": steps, "line": i})
    if not reqs:
        raise InputError(f"--outputs {path}: no requests")
    return reqs


def _setting_int(fields: dict, *names: str) -> int:
    for n in names:
        v = fields.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_POS:
            return v
    raise InputError(f"import-vllm --outputs: --set {names[0]}=N (1..{MAX_POS}) is needed to replay vLLM's drafts")


def end_correction(m: dict, outputs: str | Path, fields: dict) -> tuple[dict, dict]:
    """(vLLM's counters counted within the outputs, {"post_end": what vLLM counted past them, "correction": ...})
    from the requests' outputs (see the module's doc). Refuses outputs and settings that do not reproduce vLLM's
    drafts and draft tokens exactly, or whose acceptance vLLM's counters cannot hold."""
    if fields.get("method") != "ngram":
        raise InputError(
            f"import-vllm --outputs: method {fields.get('method')!r}: only ngram drafts can be recomputed from the "
            "outputs (--set method=ngram)"
        )
    k = _setting_int(fields, "k", "num_speculative_tokens")
    n_min = _setting_int(fields, "prompt_lookup_min")
    n_max = _setting_int(fields, "prompt_lookup_max")
    if n_min > n_max:
        raise InputError("import-vllm --outputs: prompt_lookup_min > prompt_lookup_max")
    counted, within = [], []  # (draft length, accepted) as vLLM counts (the open ones: at least), within
    room = [0] * (k + 1)  # room[j]: open last drafts that could still have accepted a j-th token past the end
    reqs = _read_outputs(outputs)
    for r in reqs:
        p, y, M = r["prompt"], r["output"], r["max_tokens"]
        ctx = np.asarray(p + y, dtype=np.int64)
        mine, pos, n = [], 1, len(y)
        while pos < n:
            d = _ngram_draft(ctx[: len(p) + pos], n_min, n_max, k)
            a, cap = common_prefix(d, y[pos:]), M - 1 - pos
            if min(len(d), cap) > 0:
                within.append((min(len(d), cap), min(a, cap)))
            if d:
                mine.append((len(d), a))
                if a == n - pos:  # the last draft ran into the end: vLLM accepted a or more
                    for j in range(a + 1, len(d) + 1):
                        room[j] += 1
            pos += a + 1
        if r["steps"] is not None:
            steps = [s for s in r["steps"] if s[0] > 0]
            same = len(steps) == len(mine) and all(
                s[0] == d and (s[1] == a or (i == len(mine) - 1 and s[1] >= a))
                for i, (s, (d, a)) in enumerate(zip(steps, mine))
            )
            if not same:
                raise InputError(f"{outputs}:{r['line']}: vLLM's steps are not the ngram drafts replayed on the output")
        counted += mine
    drafts, tokens = len(counted), sum(d for d, _ in counted)
    if (drafts, tokens) != (m["num_drafts"], m["num_draft_tokens"]):
        raise InputError(
            f"{outputs}: replaying vLLM's ngram rule on these outputs gives {drafts} drafts of {tokens} tokens; the "
            f"counters hold {m['num_drafts']} of {m['num_draft_tokens']} (other requests, settings or outputs?)"
        )
    per = m["accepted_per_pos"] + [0] * max(0, k - len(m["accepted_per_pos"]))
    known = [sum(a >= j for _, a in counted) for j in range(1, k + 1)]
    past = [c - w for c, w in zip(per, known)]
    if len(per) > k or any(x < 0 or x > room[j] for j, x in enumerate(past, 1)):
        raise InputError(f"{outputs}: vLLM's accepted tokens per position cannot be these outputs' drafts'")
    acc = [sum(a >= j for _, a in within) for j in range(1, k + 1)]
    w = {"num_drafts": len(within), "num_draft_tokens": sum(d for d, _ in within), "num_accepted_tokens": sum(acc)}
    w["accepted_per_pos"] = acc
    post = {c: m[c] - w[c] for c in COUNTERS} | {"accepted_per_pos": [x - y for x, y in zip(per, acc)]}
    return w, {"post_end": post, "correction": {"outputs": str(outputs), "requests": len(reqs)}}


def import_vllm(
    metrics_json: str | Path, out_dir: str | Path, manifest_fields: dict, outputs: str | Path | None = None
) -> Path:
    """Write out_dir/observed_vllm.json from vLLM's spec-decode metrics; `manifest_fields` must name the engine
    (e.g. "vllm 0.32.0 cpu") and may carry settings (method, k, prompt_lookup_min/max, target, hardware).
    `outputs`: the requests' outputs, to count within them (the end correction, see the module's doc)."""
    fields = dict(manifest_fields)
    engine = fields.pop("engine", None)
    if not engine:
        raise InputError("import-vllm: name the engine (e.g. engine='vllm 0.32.0 cpu'): observed figures are its")
    m = read_vllm_metrics(metrics_json)
    if not m["num_drafts"]:  # refused before anything is written
        raise InputError(f"{metrics_json}: no drafts were counted (was speculative decoding on?)")
    extra = {}
    if outputs is not None:
        within, extra = end_correction(m, outputs, fields)
        _check(outputs, within)
        extra = {"counted": "within the output", "as_counted": m} | extra
        m = within
    rec = {"v": SCHEMA_VERSION, "kind": "observed", "label": "MEASURED", "counterfactual": False, "engine": engine}
    rec |= {"settings": fields, "source": str(metrics_json)} | m | extra
    out = Path(out_dir)
    if out.is_symlink():
        raise InputError(f"--out {out}: is a symlink: not written through")
    out.mkdir(parents=True, exist_ok=True)
    path = out / OBSERVED_NAME
    try:
        write_text(path, json.dumps(rec, indent=1) + "\n", replace_different=False)
    except FileExistsError as e:
        raise InputError(f"{path}: {e.strerror}; not replaced (remove it, or import into another directory)") from None
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
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{p}: not a JSON record ({e})") from None
    if not isinstance(rec, dict) or rec.get("kind") != "observed":
        raise InputError(f"{p}: not an observed-only engine record (kind 'observed')")
    raw = {c: rec.get(c) for c in COUNTERS} | {PER_POS: rec.get("accepted_per_pos")}
    missing = [c for c, v in raw.items() if v is None]
    if missing:
        raise InputError(f"{p}: {missing[0]} missing")
    counters(p, raw)  # a hand-edited record is checked as an import is
    if "as_counted" in rec:  # an end-corrected record: vLLM's own counters are kept, and checked too
        a = rec["as_counted"] if isinstance(rec["as_counted"], dict) else {}
        counters(f"{p} (as_counted)", {c: a.get(c) for c in COUNTERS} | {PER_POS: a.get("accepted_per_pos")})
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
    if "as_counted" in r:
        pe = r.get("post_end", {})
        lines.append(
            f"  counted within the outputs; vLLM also counted past them: drafts +{pe.get('num_drafts')}, draft "
            f"tokens +{pe.get('num_draft_tokens')}, accepted per position +{pe.get('accepted_per_pos')}"
        )
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
    outputs: str = typer.Option(
        None,
        "--outputs",
        help="the requests' prompts and outputs (JSON lines): count within the outputs (ngram; see the doc)",
    ),
) -> None:
    """Import vLLM's spec-decode counters as an observed-only record (not a block log) and print its summary.

    The counters (drafts, draft tokens, accepted tokens per position) are what vLLM's one drafter did along its own
    trajectory: they are reported [MEASURED] with the engine named; replay, oracles and policies refuse them.
    """
    path = import_vllm(metrics, out, {"engine": engine} | _settings(settings), outputs)
    summarize_observed(path)
    typer.echo(f"observed record: {path}")
