"""A parametric simulator of schema-v1 block logs, with planted truth for the tests.

The model (probit, teacher-forced, one latent per (prompt, position, drafter)):

    L[p,t,d] = mu[w,d] + u[p] + u[p,d] + sqrt(shared) * z[p,t] + sqrt(1 - shared) * e[p,t,d]
    correct[p,t,d] = L[p,t,d] > 0          # drafter d would predict the target's token t
    accepted[p,t,d] = min(run of correct from t, k, n[p] - 1 - t)

`mu` is the probit of a drafter's per-token acceptance on a workload, `u` per-prompt random
effects (shared, and per drafter: blocks of a prompt are correlated, which is what makes
prompt clusters the bootstrap unit), `z` the per-position difficulty all drafters share
(correlated drafters). Accepted lengths are run lengths of one chain, exactly what a
teacher-forced dense log holds: acceptance `a >= 1` at `t` implies at least `a - 1` at `t+1`.
Per-token confidence is `sigmoid(conf_base[w] + s*2*L + sqrt(1-s^2)*eps)` with `s` the
workload's signal strength: `s = 0` makes features independent of acceptance. With
`ranking_flips` drafter `w mod D` leads workload `w` by `flip_margin` (probit), so the best
drafter differs by workload; without it the ranking is the same everywhere. Every prompt has
`out_len` output tokens, or its own `out_lens[p]` (a campaign of a logged design: its lengths).

    python bandit/sim/simulate.py --out runs/sim      # regenerate the shipped [SIM] campaign
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/sim/simulate.py`: import our `bandit`, not a namesake
    import pathlib, sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import dataclasses
import gc
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from scipy.special import expit, ndtr

from bandit import __version__
from bandit.logs.safeio import write_file
from bandit.logs.schema import FEATURES, features
from bandit.logs.table import BlockTable, is_dense

VOCAB = 32000


@dataclass(frozen=True)
class SimConfig:
    """Every knob of the simulated campaign; W workloads, D drafters. Defaults: the shipped `runs/sim/`."""

    workloads: tuple[str, ...] = ("chat", "code", "copy", "math")
    drafters: tuple[str, ...] = ("cascade", "dflash", "eagle", "ngram")
    # per-token acceptance probability at an average prompt: drafter base (D,) x workload shift (W,)
    # in probit units; `token_accept` (W,D) overrides both when given
    drafter_accept: tuple[float, ...] = (0.78, 0.80, 0.68, 0.50)
    workload_shift: tuple[float, ...] = (-0.25, 0.05, 0.55, 0.0)
    token_accept: tuple[tuple[float, ...], ...] | None = None
    ranking_flips: bool = False
    flip_margin: float = 0.2  # probit lead of drafter w mod D on workload w when flips are on
    shared: float = 0.9  # share of the per-position latent variance common to all drafters
    prompt_sd: float = 0.25  # per-prompt random effect, shared by the drafters
    prompt_drafter_sd: float = 0.15  # per-prompt random effect, per drafter
    signal: tuple[float, ...] = (0.8, 0.8, 0.0, 0.8)  # (W,) confidence signal strength in [0,1]
    conf_base: tuple[float, ...] = (0.0, 0.3, 2.5, 0.2)  # (W,) logit offset of confidence
    empty_rate: tuple[float, ...] = (0.0, 0.0, 0.0, 0.4)  # (D,) P(no draft) where the first token would miss
    n_prompts: int = 24  # per workload
    out_len: int = 96  # target output tokens per prompt
    out_lens: tuple[int, ...] | None = None  # (W * n_prompts,) per-prompt output lengths, workload-major,
    # each in 1..out_len; None: every prompt has out_len
    k: int = 8  # maximum draft length
    dense: bool = True  # a record at every position (else block starts of `behaviour` only)
    behaviour: int = 1  # drafter index whose trajectory marks `block` (the logged run)
    drafter_ms: tuple[float, ...] = (3.0, 2.8, 1.6, 0.05)  # (D,) wall ms of one drafting call
    verify_ms: float = 10.0  # target verification of k + 1 tokens
    seed: int = 0

    def __post_init__(self):
        W, D = len(self.workloads), len(self.drafters)
        for name, n in (
            ("drafter_accept", D),
            ("empty_rate", D),
            ("drafter_ms", D),
            ("workload_shift", W),
            ("signal", W),
            ("conf_base", W),
        ):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SimConfig.{name}: expected {n} values, got {len(getattr(self, name))}")
        if self.token_accept is not None and np.shape(self.token_accept) != (W, D):
            raise ValueError(f"SimConfig.token_accept: expected shape {(W, D)}, got {np.shape(self.token_accept)}")
        if not all(0.0 <= s <= 1.0 for s in self.signal):
            raise ValueError(f"SimConfig.signal: values must lie in [0, 1], got {self.signal}")
        if not 0.0 <= self.shared <= 1.0:
            raise ValueError(f"SimConfig.shared: must lie in [0, 1], got {self.shared}")
        if self.k < 1 or self.out_len < 1 or self.n_prompts < 1:
            raise ValueError("SimConfig: k, out_len and n_prompts must be >= 1")
        if self.out_lens is not None and (
            len(self.out_lens) != W * self.n_prompts or not all(1 <= int(x) <= self.out_len for x in self.out_lens)
        ):
            raise ValueError(
                f"SimConfig.out_lens: expected {W * self.n_prompts} lengths (W * n_prompts) in "
                f"1..out_len={self.out_len}"
            )
        if not 0 <= self.behaviour < D:
            raise ValueError(f"SimConfig.behaviour: drafter index out of range 0..{D - 1}")
        # BlockTable promises sorted names: keep the simulator's indices equal to the loader's
        if list(self.workloads) != sorted(self.workloads) or list(self.drafters) != sorted(self.drafters):
            raise ValueError("SimConfig: give workloads and drafters in sorted order (the loader sorts them)")

    def lengths(self) -> np.ndarray:
        """(W * n_prompts,) int64 output length of each prompt, workload-major."""
        if self.out_lens is None:
            return np.full(len(self.workloads) * self.n_prompts, self.out_len, np.int64)
        return np.asarray(self.out_lens, np.int64)

    def mu(self) -> np.ndarray:
        """(W,D) probit of the per-token acceptance at an average prompt."""
        from scipy.special import ndtri

        if self.token_accept is not None:
            m = ndtri(np.asarray(self.token_accept, float))
        else:
            m = ndtri(np.asarray(self.drafter_accept))[None, :] + np.asarray(self.workload_shift)[:, None]
        if self.ranking_flips:
            W, D = m.shape
            m = m.copy()
            for w in range(W):  # drafter w mod D leads workload w by flip_margin
                m[w, w % D] = np.delete(m[w], w % D).max() + self.flip_margin
        return m


@dataclass(frozen=True)
class SimArrays:
    """The simulated campaign as arrays; P = W * n_prompts prompts, n = out_len positions."""

    y: np.ndarray  # (P, n) int64: the target's output tokens
    accepted: np.ndarray  # (P, n, D) int32
    draft_len: np.ndarray  # (P, n, D) int32: k, or 0 for an empty draft
    conf: np.ndarray  # (P, n, D, k) float64, rounded to 4 decimals (what the JSON holds)
    entropy: np.ndarray  # (P, n, D, k) float64, idem
    block: np.ndarray  # (P, n) int64: block index on the behaviour trajectory, -1 elsewhere
    ms: np.ndarray  # (P, n, D) float64
    target_ms: np.ndarray  # (P, n) float64


def _generate(cfg: SimConfig) -> SimArrays:
    rng = np.random.default_rng(cfg.seed)
    W, D, k, n = len(cfg.workloads), len(cfg.drafters), cfg.k, cfg.out_len
    P = W * cfg.n_prompts
    wl = np.repeat(np.arange(W), cfg.n_prompts)  # (P,)
    u = rng.normal(0, cfg.prompt_sd, (P, 1)) + rng.normal(0, cfg.prompt_drafter_sd, (P, D))
    z = rng.normal(size=(P, n, 1))
    e = rng.normal(size=(P, n, D))
    lat = cfg.mu()[wl][:, None, :] + u[:, None, :] + np.sqrt(cfg.shared) * z + np.sqrt(1 - cfg.shared) * e
    correct = lat > 0  # (P, n, D)

    run = np.zeros((P, n + 1, D), np.int32)
    for t in range(n - 1, -1, -1):  # run length of correct predictions starting at t
        run[:, t] = (run[:, t + 1] + 1) * correct[:, t]
    n_p = cfg.lengths()  # (P,) each output's end
    cap = np.clip(np.minimum(k, n_p[:, None] - 1 - np.arange(n)[None, :]), 0, None)  # (P, n)
    accepted = np.minimum(run[:, :n], cap[:, :, None]).astype(np.int32)

    # A lookup drafter sometimes has nothing to propose; only where its first token would miss,
    # so the teacher-forced chain property holds for the logged accepted lengths.
    empty = (~correct) & (rng.random((P, n, D)) < np.asarray(cfg.empty_rate)[None, None, :])
    draft_len = np.where(empty, 0, k).astype(np.int32)

    # token i of the draft at t sits at position t+i: its confidence reads that position's latent
    s = np.asarray(cfg.signal)[wl][:, None, None, None]
    lat_pad = np.concatenate([lat, np.repeat(lat[:, -1:], k, axis=1)], axis=1)
    win = np.lib.stride_tricks.sliding_window_view(lat_pad, k, axis=1)[:, :n]  # (P, n, D, k)
    logit = (
        np.asarray(cfg.conf_base)[wl][:, None, None, None]
        + s * 2.0 * win
        + np.sqrt(1 - s**2) * rng.normal(size=win.shape)
    )
    conf = np.round(expit(logit), 4)
    pc = np.clip(conf, 1e-4, 1 - 1e-4)
    ent = np.round(-(pc * np.log(pc) + (1 - pc) * np.log1p(-pc)) + 0.2 * np.abs(rng.normal(size=win.shape)), 4)

    y = rng.integers(0, VOCAB, (P, n))
    block = np.full((P, n), -1, np.int64)
    b = cfg.behaviour
    for p in range(P):
        t, j = 0, 0
        while t < n_p[p]:
            block[p, t] = j
            t += int(accepted[p, t, b]) + 1
            j += 1
    ms = np.round(np.asarray(cfg.drafter_ms)[None, None, :] * rng.lognormal(0, 0.1, (P, n, D)), 3)
    target_ms = np.round(cfg.verify_ms * rng.lognormal(0, 0.05, (P, n)), 3)
    return SimArrays(
        y=y, accepted=accepted, draft_len=draft_len, conf=conf, entropy=ent, block=block, ms=ms, target_ms=target_ms
    )


def _kept(cfg: SimConfig, arr: SimArrays) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, pos) index arrays of the records the log holds (all, or block starts if sparse)."""
    inside = np.arange(arr.block.shape[1])[None, :] < cfg.lengths()[:, None]
    keep = inside if cfg.dense else (arr.block >= 0) & inside
    return np.nonzero(keep)


def _prompt_names(cfg: SimConfig) -> list[tuple[str, str]]:
    return [(w, f"p{i:04d}") for w in cfg.workloads for i in range(cfg.n_prompts)]


def _draft_tokens(arr: SimArrays, p: np.ndarray, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(R, D, k) draft tokens: the target's tokens while accepted, then a wrong one, then noise."""
    P, n = arr.y.shape
    D, k = arr.accepted.shape[2], arr.conf.shape[3]
    ypad = np.concatenate([arr.y, np.zeros((P, k), arr.y.dtype)], axis=1)
    truth = ypad[p[:, None] + 0, t[:, None] + np.arange(k)[None, :]]  # (R, k)
    noise = rng.integers(1, VOCAB, (len(p), D, k))
    i = np.arange(k)[None, None, :]
    a = arr.accepted[p, t][:, :, None]
    toks = np.where(i < a, truth[:, None, :], (truth[:, None, :] + noise) % VOCAB)
    return toks


def _records(cfg: SimConfig, arr: SimArrays, p: np.ndarray, t: np.ndarray, toks: np.ndarray) -> list[dict]:
    names = _prompt_names(cfg)
    acc, dl = arr.accepted[p, t].tolist(), arr.draft_len[p, t].tolist()
    conf, ent = arr.conf[p, t].tolist(), arr.entropy[p, t].tolist()
    ms, tms, blk = arr.ms[p, t].tolist(), arr.target_ms[p, t].tolist(), arr.block[p, t].tolist()
    toks = toks.tolist()
    out = []
    for r, (pi, ti) in enumerate(zip(p.tolist(), t.tolist())):
        drafts = {}
        for j, d in enumerate(cfg.drafters):
            L = dl[r][j]
            drafts[d] = {
                "tokens": toks[r][j][:L],
                "accepted": acc[r][j],
                "conf": conf[r][j][:L],
                "entropy": ent[r][j][:L],
                "ms": ms[r][j],
            }
        rec = {"v": 1, "workload": names[pi][0], "prompt_id": names[pi][1], "pos": ti}
        if blk[r] >= 0:
            rec["block"] = blk[r]
        rec["drafts"] = drafts
        rec["target_ms"] = tms[r]
        out.append(rec)
    return out


def simulate(cfg: SimConfig) -> list[dict]:
    """The log's records (schema v1 dicts), sorted by (workload, prompt_id, pos)."""
    arr = _generate(cfg)
    p, t = _kept(cfg, arr)
    return _records(cfg, arr, p, t, _draft_tokens(arr, p, t, np.random.default_rng([cfg.seed, 1])))


def manifest(cfg: SimConfig, run: str = "sim") -> dict:
    """The run manifest (docs/manifest.md), label SIM, with the full config for reproduction."""
    k = cfg.k
    toks = [1, 2, 4, k, k + 1]
    return {
        "v": 1,
        "label": "SIM",
        "run": run,
        "created": "2026-11-30T00:00:00Z",
        "mode": "dense" if cfg.dense else "sparse",
        "target": {"name": "sim-target", "path": None, "sha256": None},
        "drafters": {
            d: {"kind": "sim", "settings": {"token_accept_base": cfg.drafter_accept[j]}, "sha256": None}
            for j, d in enumerate(cfg.drafters)
        },
        "k": k,
        "temperature": 0.0,
        "seed": cfg.seed,
        "workloads": list(cfg.workloads),
        "hardware": {"device": "none (simulated)", "torch": None, "cpu": None, "gpu": None},
        "code_version": f"specbandit {__version__}",
        # verify time grows mildly with verified tokens; a batch of N drafts costs ~ +12% per extra draft
        "timing": {
            "verify_ms": {"tokens": toks, "ms": [round(cfg.verify_ms * (0.85 + 0.15 * x / (k + 1)), 4) for x in toks]},
            "verify_batch_ms": {
                "drafts": [1, 2, 3, 4],
                "ms": [round(cfg.verify_ms * (1 + 0.12 * i), 4) for i in range(4)],
            },
            "drafter_ms": dict(zip(cfg.drafters, cfg.drafter_ms)),
        },
        # out_lens only when set: the shipped runs/sim manifest predates the field and stays byte-identical
        "sim_config": {k: v for k, v in dataclasses.asdict(cfg).items() if not (k == "out_lens" and v is None)},
    }


def write_sim_run(
    cfg: SimConfig, out_dir: str | Path, gz: bool = True, chunk: int = 20000, compresslevel: int = 6
) -> Path:
    """Write `blocks_sim.jsonl[.gz]` and `manifest.json` into `out_dir`; returns the log's path.

    Byte-identical for the same config (gzip header without a timestamp or file name).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arr = _generate(cfg)
    p, t = _kept(cfg, arr)
    rng = np.random.default_rng([cfg.seed, 1])
    toks = _draft_tokens(arr, p, t, rng)  # one draw for all rows: chunking must not change the bytes
    path = out_dir / ("blocks_sim.jsonl.gz" if gz else "blocks_sim.jsonl")
    dump = lambda o: json.dumps(o, separators=(",", ":")).encode()  # the same bytes wherever it runs

    def write(raw) -> None:
        f = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=compresslevel) if gz else raw
        for s in range(0, len(p), chunk):
            recs = _records(cfg, arr, p[s : s + chunk], t[s : s + chunk], toks[s : s + chunk])
            f.write(b"\n".join(map(dump, recs)) + b"\n")
        if gz:
            f.close()

    gc_on = gc.isenabled()
    gc.disable()  # millions of short-lived dicts and lists: the collector would rescan them for nothing
    try:
        write_file(path, write)  # bandit/logs/safeio.py: never through a symlink, atomic
    finally:
        if gc_on:
            gc.enable()
    m = manifest(cfg, run=out_dir.name)
    write_file(out_dir / "manifest.json", lambda f: f.write((json.dumps(m, indent=2) + "\n").encode()))
    return path


def simulate_table(cfg: SimConfig) -> BlockTable:
    """The campaign as a `BlockTable` in memory (what `load_logs` of `write_sim_run` returns)."""
    arr = _generate(cfg)
    p, t = _kept(cfg, arr)
    dl = arr.draft_len[p, t]
    conf, ent = arr.conf[p, t], arr.entropy[p, t]  # (R, D, k), the first dl entries of each draft used
    R, D = len(p), len(cfg.drafters)
    used = np.arange(conf.shape[-1]) < dl[..., None]
    feats = features(conf[used], ent[used], dl.ravel()).reshape(R, D, len(FEATURES))  # the loaders' own features
    wl = np.repeat(np.arange(len(cfg.workloads)), cfg.n_prompts)
    return BlockTable(
        drafters=tuple(cfg.drafters),
        workloads=tuple(cfg.workloads),
        prompt_ids=tuple(f"{w}/{q}" for w, q in _prompt_names(cfg)),
        workload=wl[p].astype(np.int32),
        prompt=p.astype(np.int32),
        pos=t.astype(np.int64),
        block=arr.block[p, t],
        accepted=arr.accepted[p, t],
        draft_len=dl,
        expected_accepted=np.full((R, D), np.nan),
        features=feats,
        ms=arr.ms[p, t],
        target_ms=arr.target_ms[p, t],
        label="SIM",
        manifests=(manifest(cfg),),
        sources=(),
        dense=is_dense(p, t),
    )


def true_mean_accepted(cfg: SimConfig, n_nodes: int = 96) -> np.ndarray:
    """(W,D) population mean of `accepted` over all records of a dense log (planted truth).

    Given the prompt effect v ~ N(0, prompt_sd^2 + prompt_drafter_sd^2) positions are
    independent with P(correct) = Phi(mu + v), so E[accepted at t | v] = sum_{i<=cap(t)} Phi^i;
    averaged over t (the cap includes the output's end; records weighted as the log holds them,
    per prompt length) and over v by Gauss-Hermite quadrature.
    """
    q, wq = _accept_nodes(cfg, n_nodes)  # (W, D, nodes), (nodes,)
    k = cfg.k
    rem = _remaining_counts(cfg)  # (W, N + 1): records with n - t = m
    cap = np.minimum(k, np.arange(rem.shape[1]) - 1).clip(0)  # (N + 1,)
    powers = q[..., None] ** np.arange(1, k + 1)  # (W, D, nodes, k)
    cum = np.concatenate([np.zeros(powers.shape[:-1] + (1,)), np.cumsum(powers, -1)], -1)
    per_m = cum[..., cap]  # (W, D, nodes, N + 1)
    per_t = (per_m * rem[:, None, None, :]).sum(-1) / rem.sum(1)[:, None, None]
    return per_t @ wq


def _accept_nodes(cfg: SimConfig, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """P(correct) at Gauss-Hermite nodes of the prompt effect: (W, D, nodes), and the weights (nodes,)."""
    x, wq = np.polynomial.hermite_e.hermegauss(n_nodes)
    sd = np.hypot(cfg.prompt_sd, cfg.prompt_drafter_sd)
    return ndtr(cfg.mu()[..., None] + sd * x), wq / wq.sum()


def _remaining_counts(cfg: SimConfig) -> np.ndarray:
    """(W, N + 1) records per workload whose output has m = n - t tokens left (m = 1..N), N = out_len."""
    W = len(cfg.workloads)
    n_p = cfg.lengths().reshape(W, cfg.n_prompts)
    hist = np.stack([np.bincount(row, minlength=cfg.out_len + 1) for row in n_p])  # prompts of length m
    return np.cumsum(hist[:, ::-1], 1)[:, ::-1] * (np.arange(cfg.out_len + 1) >= 1)  # prompts of length >= m


def true_tokens_per_pass(cfg: SimConfig, n_nodes: int = 96) -> np.ndarray:
    """(W,D) planted tokens per target pass along each drafter's own trajectory (every block on drafter d).

    Given the prompt effect v the positions are independent with P(correct) = Phi(mu + v), and a
    block starting with m tokens left accepts j < cap with probability q^j (1 - q), cap = min(k, m - 1)
    with q^cap, then the next block starts with m - j - 1 left; so the expected passes g(m) of an
    output with m tokens left obey g(0) = 0, g(m) = 1 + sum_j P(a = j) g(m - j - 1) (exact). Per
    workload: sum of its prompts' tokens / sum of their expected passes, averaged over v by
    Gauss-Hermite quadrature (the ratio of expectations a campaign's tokens / passes estimates).
    """
    q, wq = _accept_nodes(cfg, n_nodes)
    k, N, W = cfg.k, cfg.out_len, len(cfg.workloads)
    g = np.zeros(q.shape + (N + 1,))
    qj = q[..., None] ** np.arange(k + 1)  # (W, D, nodes, k + 1): q^j
    for m in range(1, N + 1):
        cap = min(k, m - 1)
        pj = qj[..., : cap + 1].copy()
        pj[..., :cap] *= 1 - q[..., None]  # P(a = j), j = 0..cap
        g[..., m] = 1 + (pj * g[..., m - 1 - np.arange(cap + 1)]).sum(-1)
    n_p = cfg.lengths().reshape(W, cfg.n_prompts)
    passes = np.stack([g[w][..., n_p[w]].sum(-1) for w in range(W)]) @ wq  # (W, D) expected passes
    return n_p.sum(1)[:, None] / passes


def cli(
    out: Annotated[str, typer.Option(help="the run directory to write")] = "runs/sim",
    seed: Annotated[int, typer.Option(help="simulation seed, in [0, 2^63)")] = 0,
    n_prompts: Annotated[int, typer.Option(help="prompts per workload, in [1, 100000]")] = 24,
    out_len: Annotated[int, typer.Option(help="output tokens per prompt, in [1, 4096]; x prompts <= 10^7")] = 96,
    sparse: bool = False,
    flips: bool = False,
    plain: bool = False,
) -> None:
    """Write a simulated [SIM] campaign (dense by default) and its manifest; print its mean accepted table.

    The defaults regenerate the shipped runs/sim/ byte-identically.
    """
    from bandit.logs.outputs import bounded, path_arg
    from bandit.logs.outputs import seed as check_seed

    out, _ = path_arg(out, "--out"), check_seed(seed)
    bounded("--n-prompts", n_prompts, 1, 100_000), bounded("--out-len", out_len, 1, 4096)
    bounded("--n-prompts x --out-len", n_prompts * out_len, 1, 10_000_000)
    cfg = SimConfig(seed=seed, n_prompts=n_prompts, out_len=out_len, dense=not sparse, ranking_flips=flips)
    path = write_sim_run(cfg, out, gz=not plain)
    t = simulate_table(cfg)
    print(f"wrote {path} [SIM]: {t.summary()}")
    truth = true_mean_accepted(cfg)
    acc = t.accepted
    print(f"{'workload':10s}" + "".join(f"{d:>18s}" for d in cfg.drafters))
    for w, name in enumerate(cfg.workloads):
        m = acc[t.workload == w].mean(0)
        print(f"{name:10s}" + "".join(f"{m[j]:8.3f} (true {truth[w, j]:5.3f})" for j in range(len(cfg.drafters))))
    print("[SIM] mean accepted over all records of the log; 'true' = planted population mean")


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(cli)
