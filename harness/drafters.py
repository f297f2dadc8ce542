"""Drafters behind one small protocol, and how the CLI names them.

A drafter proposes up to k tokens after a prefix (the prompt plus the target's output so far)
and says how sure it is of each. The protocol (subclass `Drafter`, or duck-type it):

    class MyDrafter(Drafter):
        kind = "mine"
        def __init__(self, name: str, settings: dict, env: DrafterEnv): ...
        def draft(self, pre: Prefix, k: int) -> Draft           # required
        def start(self, workload: str, prompt_id: str) -> None     # optional: a new prompt begins
        def finish(self, output: list[int]) -> None                # optional: the prompt's output is final
        def dense(self, seq: Sequence, done: dict) -> list[Draft]  # optional: drafts at every position at once
        def info(self) -> dict                                     # optional: {"settings": ..., "sha256": ...}

`Draft` holds `tokens`, `conf` (the drafter's probability of each token, or its own score in
[0, 1]), `entropy` (nats), and `q` (the probability the token was proposed with, for
`expected_accepted`; None for deterministic drafters). `Prefix.feats` holds the target's
features (the input of its lm_head) at positions 0..len(ids)-2, which is what feature-level
heads need. Drafts must be a deterministic function of the prefix, the prompt key and the
drafter's state from earlier prompts: that is what makes dense logs equal to live runs.

Naming a drafter on the CLI: `--drafter NAME=KIND[:key=value,...]` with KIND one of
`ngram`, `suffix`, `draft`, `medusa`, `eagle`, `cascade` (settings below), or

  * an import path: `--drafter dflash=my_pkg.dflash:DFlashDrafter:path=/ckpt,steps=4`
  * an entry point: a package that declares, in its pyproject.toml,
        [project.entry-points."specbandit.drafters"]
        dflash = "my_pkg.dflash:DFlashDrafter"
    is then named as `--drafter d1=dflash:path=/ckpt`.

The class is called as `cls(name, settings, env)`; values in settings are parsed as int,
float, bool (true/false) or left as strings. `env` gives the loaded target, tokenizer,
device, dtype, models root, temperature, seed and the drafters defined before it.
"""
from __future__ import annotations

import importlib
import math
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import torch

from . import lm
from .heads import EagleHead, MedusaHeads
from .lm import HarnessError
from .sampling import choose, conf_entropy, probs, stream_id

ENTRY_POINT_GROUP = "specbandit.drafters"
STEP_KEYS = 4096  # a drafter's noise at (origin pos, step j) is keyed pos * STEP_KEYS + j; k < STEP_KEYS


@dataclass
class Draft:
    tokens: list[int]
    conf: list[float]
    entropy: list[float]
    q: list[float] | None = None  # proposal probabilities; None = deterministic (point mass)

    @staticmethod
    def empty() -> "Draft":
        return Draft([], [], [], None)


@dataclass
class Prefix:
    ids: list[int]  # prompt + output so far
    n_prompt: int
    feats: torch.Tensor | None  # (>= len(ids)-1, H): target features at positions 0..len(ids)-2
    pkey: int  # the prompt's noise key (sampling.prompt_key)
    temperature: float
    speculative: int = 0  # trailing ids that are draft tokens, not output (cascade extension)

    @property
    def pos(self) -> int:
        return len(self.ids) - self.n_prompt - self.speculative


@dataclass
class Sequence:
    """A finished prompt for dense drafting: origin pos has prefix ids[:n_prompt + pos]."""
    ids: list[int]
    n_prompt: int
    feats: torch.Tensor | None
    pkey: int
    temperature: float
    ks: list[int]  # draft length at each origin 0..N-1

    def prefix(self, pos: int) -> Prefix:
        return Prefix(self.ids[: self.n_prompt + pos], self.n_prompt, self.feats, self.pkey, self.temperature)


@dataclass
class DrafterEnv:
    target: object  # the target model (transformers PreTrainedModel)
    tokenizer: object
    target_path: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"
    models_root: str | None = None
    temperature: float = 0.0
    seed: int = 0
    drafters: dict = field(default_factory=dict)  # name -> drafter, those defined earlier


class Drafter:
    kind = ""
    needs_features = False  # True: drafts read Prefix.feats

    def __init__(self, name: str, settings: dict, env: DrafterEnv):
        self.name, self.settings, self.env = name, dict(settings), env
        self.stream = stream_id(name)

    def start(self, workload: str, prompt_id: str) -> None:
        pass

    def finish(self, output: list[int]) -> None:
        pass

    def draft(self, pre: Prefix, k: int) -> Draft:
        raise NotImplementedError

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        """Drafts at every origin. Default: one `draft` call per position (the naive loop)."""
        return [self.draft(seq.prefix(p), k) for p, k in enumerate(seq.ks)]

    def info(self) -> dict:
        return {"settings": self.settings, "sha256": None}

    def _setting(self, key, default, cast=None):
        v = self.settings.setdefault(key, default)
        if v is None:
            raise HarnessError(f"--drafter {self.name}={self.kind}: missing setting {key}=")
        return cast(v) if cast else v

    def _check_settings(self, allowed: set[str]) -> None:
        bad = sorted(set(self.settings) - allowed)
        if bad:
            raise HarnessError(f"--drafter {self.name}={self.kind}: unknown setting(s) {bad}; "
                               f"known: {sorted(allowed)}")


def _entropy(counts) -> float:
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log(c / n) for c in counts if c))


# -------------------------------------------------------------------------- lookup drafters


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output: the most recent earlier occurrence of the longest
    suffix n-gram (n_max down to n_min) is copied forward (overlapping copies continue a
    repeated span, LZ77-style). conf[j]: the fraction of the n-gram's occurrences whose
    continuation agrees with the draft up to and including j (carried forward past the
    known continuations); entropy[j]: of those occurrences' next tokens."""
    kind = "ngram"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.n_min = self._setting("n_min", 1, int)  # shortest suffix pattern tried
        self.n_max = self._setting("n_max", 4, int)  # longest suffix pattern tried (tried first)
        self.max_occ = self._setting("max_occ", 64, int)  # most recent occurrences used for conf
        self._check_settings({"n_min", "n_max", "max_occ"})
        if not 1 <= self.n_min <= self.n_max:
            raise HarnessError(f"--drafter {name}=ngram: need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")

    def draft(self, pre: Prefix, k: int) -> Draft:
        ids = np.asarray(pre.ids, dtype=np.int64)
        P = len(ids)
        for n in range(min(self.n_max, P - 1), self.n_min - 1, -1):
            pat = ids[P - n:]
            win = np.lib.stride_tricks.sliding_window_view(ids[: P - 1], n)  # starts 0..P-1-n
            hits = np.flatnonzero((win == pat).all(1))
            if len(hits):
                return self._copy(ids, hits[-self.max_occ:] + n, k)
        return Draft.empty()

    @staticmethod
    def _copy(ids: np.ndarray, starts: np.ndarray, k: int) -> Draft:
        P, src = len(ids), int(starts[-1])
        seq = list(ids)
        for j in range(k):  # overlapping copy: may read tokens it has just drafted
            seq.append(seq[src + j])
        toks = seq[P:]
        conts = [ids[s: min(P, s + k)].tolist() for s in starts]
        conf, ent, c_prev = [], [], 1.0
        for j in range(k):
            alive = [c for c in conts if len(c) > j and c[:j] == toks[:j]]
            if alive:
                cnt = Counter(c[j] for c in alive)
                c_prev = cnt[toks[j]] / len(alive)
                conf.append(c_prev)
                ent.append(_entropy(cnt.values()))
            else:
                conf.append(c_prev)
                ent.append(0.0)
        return Draft([int(t) for t in toks], conf, ent, None)


class SuffixDrafter(Drafter):
    """SuffixDecoding-style lookup over the current prompt + output and every earlier output
    of the run: the longest suffix of the prefix (up to max_depth tokens) with a recorded
    continuation is found; the draft follows the most frequent continuation token by token
    (ties: the most recent), conf[j] = its count / the count of continuations still
    consistent with the draft, and drafting stops once the product of confs < min_score."""
    kind = "suffix"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.max_depth = self._setting("max_depth", 8, int)  # longest suffix pattern matched
        self.max_occ = self._setting("max_occ", 256, int)  # most recent occurrences followed
        self.min_score = self._setting("min_score", 0.1, float)  # stop when prod(conf) falls below
        self._check_settings({"max_depth", "max_occ", "min_score"})
        self.seqs: list[list[int]] = []  # corpus: earlier outputs, then the current sequence last
        self.index: dict[tuple, list[tuple[int, int]]] = {}  # pattern -> [(seq, end index)]
        self._cur: list[int] | None = None  # the current prompt's sequence (indexed part)
        self._cur_keys: set = set()  # patterns the current sequence added: what un-indexing visits

    def _add(self, s: int, seq: list[int], lo: int, hi: int, keys: set | None = None) -> None:
        """Index pattern ends e in [lo, hi) of seqs[s] (each needs a continuation at e+1)."""
        for e in range(lo, hi):
            for m in range(1, min(self.max_depth, e + 1) + 1):
                key = tuple(seq[e - m + 1: e + 1])
                self.index.setdefault(key, []).append((s, e))
                if keys is not None:
                    keys.add(key)

    def start(self, workload, prompt_id):
        self._drop_current()

    def _drop_current(self):
        if self._cur is not None:  # un-index the current sequence (it is the last one)
            s = len(self.seqs) - 1
            for key in self._cur_keys:  # its entries are the newest, so they sit at the ends of the lists
                occ = self.index[key]
                while occ and occ[-1][0] == s:
                    occ.pop()
                if not occ:
                    del self.index[key]
            self.seqs.pop()
        self._cur, self._cur_keys = None, set()

    def finish(self, output):
        self._drop_current()
        out = list(output)
        self.seqs.append(out)
        self._add(len(self.seqs) - 1, out, 0, len(out) - 1)

    def _sync(self, ids: list[int]) -> None:
        """Make the current sequence's index cover ids[:-1] (pattern ends up to len-2)."""
        cur = self._cur
        if cur is None or len(ids) < len(cur) or ids[: len(cur)] != cur:
            self._drop_current()
            self.seqs.append([])
            cur = []
        s = len(self.seqs) - 1
        self.seqs[s] = list(ids)
        self._add(s, self.seqs[s], max(0, len(cur) - 1), len(ids) - 1, self._cur_keys)
        self._cur = list(ids)

    def draft(self, pre: Prefix, k: int) -> Draft:
        true_ids = pre.ids[: len(pre.ids) - pre.speculative]
        self._sync(true_ids)
        ids = pre.ids
        occ = None
        for m in range(min(self.max_depth, len(ids)), 0, -1):
            occ = self.index.get(tuple(ids[-m:]))
            if occ:
                break
        if not occ:
            return Draft.empty()
        conts = [self.seqs[s][e + 1: e + 1 + k] for s, e in occ[-self.max_occ:]]
        toks, conf, ent, score = [], [], [], 1.0
        for j in range(k):
            alive = [c for c in conts if len(c) > j and c[:j] == toks]
            if not alive:
                break
            cnt = Counter(c[j] for c in alive)
            last = {c[j]: i for i, c in enumerate(alive)}  # most recent index of each token
            tok = max(cnt, key=lambda t: (cnt[t], last[t]))
            c = cnt[tok] / len(alive)
            score *= c
            if score < self.min_score:
                break
            toks.append(int(tok)); conf.append(c); ent.append(_entropy(cnt.values()))
        return Draft(toks, conf, ent, None)


# --------------------------------------------------------------------------- model drafters


def _chain_allow(limit: torch.Tensor, n_seq: int, step: int) -> torch.Tensor:
    """Mask for step `step` (1-based) of M parallel draft chains after a cached sequence of
    n_seq keys and step-1 earlier chain blocks of M keys: chain m sees sequence keys
    < limit[m] and its own earlier chain tokens (an identity block per step)."""
    M = limit.shape[0]
    seq = torch.arange(n_seq, device=limit.device)[None, :] < limit[:, None]
    eye = torch.eye(M, dtype=torch.bool, device=limit.device)
    return torch.cat([seq] + [eye] * step, 1)


class _ModelDrafter(Drafter):
    """Shared: choosing tokens with the drafter's own noise stream and scoring them."""

    def _pick(self, logits: torch.Tensor, T: float, pkey: int, keys: torch.Tensor):
        tok = choose(logits, T, pkey, keys, self.stream)
        conf, ent = conf_entropy(probs(logits, T), tok)
        return tok, conf, ent

    @staticmethod
    def _assemble(toks, confs, ents, T, lens) -> list[Draft]:
        """Per-origin drafts from per-step tensors (steps, M), truncated to lens[m]."""
        toks, confs, ents = (torch.stack(x).T.cpu().tolist() if x else [] for x in (toks, confs, ents))
        out = []
        for m, n in enumerate(lens):
            t, c, e = (toks[m][:n], confs[m][:n], ents[m][:n]) if n else ([], [], [])
            out.append(Draft([int(x) for x in t], c, e, list(c) if T > 0 else None))
        return out

    def _chunks(self, seq: Sequence, first: int):
        """Origins with a non-empty draft, from origin `first`, in chunks of `batch`."""
        orig = [p for p, k in enumerate(seq.ks) if k > 0 and p >= first]
        for i in range(0, len(orig), self.batch):
            yield orig[i: i + self.batch]


class DraftModelDrafter(_ModelDrafter):
    """An independent small causal LM sharing the target's tokenizer (`path=`). Live drafting
    keeps its own KV cache, cropped to the prefix it shares with the new one. Dense drafting
    is teacher-forced: one pass over the whole sequence gives every origin's first token,
    then each further step is one pass over all origins at once, each attending to its own
    prefix and its own chain through a custom attention mask."""
    kind = "draft"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=draft path")
        lm.check_same_tokenizer(env.tokenizer, lm.load_tokenizer(self.path), str(env.target_path), str(self.path))
        self.model = lm.load_lm(self.path, env.device, env.dtype)
        self.cache, self.cache_ids = None, []

    def info(self):
        return {"settings": self.settings, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.cache, self.cache_ids = lm.new_cache(), []

    def draft(self, pre: Prefix, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        ids, P, T = pre.ids, len(pre.ids), pre.temperature
        if self.cache is None:
            self.start("", "")
        common = 0
        for a, b in zip(self.cache_ids, ids):
            if a != b:
                break
            common += 1
        keep = min(common, P - 1, lm.cache_len(self.cache))
        lm.crop(self.cache, keep)
        dev = self.env.device
        logits, _ = lm.forward(self.model, torch.tensor(ids[keep:], device=dev), self.cache)
        logits = logits[-1:]
        toks, confs, ents = [], [], []
        for j in range(k):
            key = torch.tensor([pre.pos * STEP_KEYS + j], device=dev)
            t, c, e = self._pick(logits, T, pre.pkey, key)
            toks.append(t); confs.append(c); ents.append(e)
            if j + 1 < k:
                logits, _ = lm.forward(self.model, t, self.cache)
        self.cache_ids = list(ids) + [int(t) for t in toks[:-1]]
        return self._assemble(toks, confs, ents, T, [k])[0]

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        dev, T = self.env.device, seq.temperature
        L, npr = len(seq.ids), seq.n_prompt
        cache = lm.new_cache()
        logits_seq, _ = lm.forward(self.model, torch.tensor(seq.ids[: L - 1], device=dev), cache)
        n_seq = L - 1
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, 0):
            o = torch.tensor(orig, device=dev)
            kmax = max(seq.ks[p] for p in orig)
            logits = logits_seq[npr + o - 1]
            toks, confs, ents = [], [], []
            for j in range(kmax):
                t, c, e = self._pick(logits, T, seq.pkey, o * STEP_KEYS + j)
                toks.append(t); confs.append(c); ents.append(e)
                if j + 1 < kmax:
                    allow = _chain_allow(npr + o, n_seq, j + 1)
                    logits, _ = lm.forward(self.model, t, cache, pos=npr + o + j, allow=allow)
            lm.crop(cache, n_seq)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.cache, self.cache_ids = None, []
        return out


class MedusaDrafter(_ModelDrafter):
    """Medusa heads (`path=`, harness.heads.MedusaHeads): head i drafts token P-1+i from the
    target feature at P-2, so one pass drafts min(k, num_heads) tokens."""
    kind = "medusa"
    needs_features = True

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self._check_settings({"path"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=medusa path")
        try:
            self.heads = MedusaHeads.load(self.path, env.target)
        except (ValueError, FileNotFoundError) as e:
            raise HarnessError(f"--drafter {name}=medusa: {e}") from None

    def info(self):
        return {"settings": {**self.settings, "num_heads": self.heads.cfg.num_heads},
                "sha256": lm.weights_sha256(self.path)}

    def _draft_many(self, feats, origins, ks, pkey, T):
        n = min(max(ks), self.heads.cfg.num_heads)
        with torch.no_grad():
            logits = self.heads(feats).float()  # (heads, M, V)
        o = torch.as_tensor(origins, device=feats.device)
        toks, confs, ents = [], [], []
        for j in range(n):
            t, c, e = self._pick(logits[j], T, pkey, o * STEP_KEYS + j)
            toks.append(t); confs.append(c); ents.append(e)
        return self._assemble(toks, confs, ents, T, [min(k, n) for k in ks])

    def draft(self, pre: Prefix, k: int) -> Draft:
        P = len(pre.ids)
        if k <= 0 or P < 2:
            return Draft.empty()
        return self._draft_many(pre.feats[P - 2: P - 1], [pre.pos], [k], pre.pkey, pre.temperature)[0]

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        out = [Draft.empty() for _ in seq.ks]
        orig = [p for p, k in enumerate(seq.ks) if k > 0 and seq.n_prompt + p >= 2]
        if orig:
            idx = torch.tensor([seq.n_prompt + p - 2 for p in orig], device=seq.feats.device)
            for p, d in zip(orig, self._draft_many(seq.feats[idx], orig, [seq.ks[p] for p in orig],
                                                   seq.pkey, seq.temperature)):
                out[p] = d
        return out


class EagleDrafter(_ModelDrafter):
    """EAGLE head (`path=`, harness.heads.EagleHead): reads pairs (feature j, token j+1) for
    j = 0..P-2 of the prefix, then drafts autoregressively on its own features. Live drafting
    keeps the head's KV cache over true pairs; dense drafting is teacher-forced like `draft`."""
    kind = "eagle"
    needs_features = True

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=eagle path")
        try:
            self.head = EagleHead.load(self.path, env.target)
        except (ValueError, FileNotFoundError) as e:
            raise HarnessError(f"--drafter {name}=eagle: {e}") from None
        self.kv, self.kv_ids = None, []  # head cache over pairs 0..n-1, and the ids it covered

    def info(self):
        return {"settings": self.settings, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.kv, self.kv_ids = None, []

    def _logits(self, f):
        return self.head.logits(f).float()

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P, T, dev = pre.ids, len(pre.ids), pre.temperature, pre.feats.device if pre.feats is not None else "cpu"
        if k <= 0 or P < 2:
            return Draft.empty()
        n_pairs = P - 1
        common = 0
        for a, b in zip(self.kv_ids, ids):
            if a != b:
                break
            common += 1
        keep = max(0, min(common - 1, n_pairs - 1, 0 if self.kv is None else self.kv[0].shape[2]))
        past = None if keep == 0 else (self.kv[0][:, :, :keep], self.kv[1][:, :, :keep])
        j = torch.arange(keep, n_pairs, device=dev)
        nxt = torch.tensor(ids[keep + 1: P], device=dev)
        pred, (kn, vn) = self.head.step(pre.feats[j][None], nxt[None], j[None], past)
        self.kv = (kn, vn) if past is None else (torch.cat([past[0], kn], 2), torch.cat([past[1], vn], 2))
        self.kv_ids = list(ids)
        f, kv = pred[:, -1:], self.kv
        toks, confs, ents = [], [], []
        for s in range(k):
            t, c, e = self._pick(self._logits(f[0]), T, pre.pkey, torch.tensor([pre.pos * STEP_KEYS + s], device=dev))
            toks.append(t); confs.append(c); ents.append(e)
            if s + 1 < k:
                f, (kn, vn) = self.head.step(f, t[None], torch.tensor([[P - 1 + s]], device=dev), kv)
                kv = (torch.cat([kv[0], kn], 2), torch.cat([kv[1], vn], 2))
        return self._assemble(toks, confs, ents, T, [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        dev, T, npr = seq.feats.device, seq.temperature, seq.n_prompt
        L = len(seq.ids)
        n_seq = L - 1  # pairs 0..L-2
        j = torch.arange(n_seq, device=dev)
        pred_seq, (ks, vs) = self.head.step(seq.feats[:n_seq][None], torch.tensor(seq.ids[1:], device=dev)[None], j[None])
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            kmax = max(seq.ks[p] for p in orig)
            f = pred_seq[0, P - 2]  # (M, H): predicted feature at P-1
            kc, vc = ks, vs
            toks, confs, ents = [], [], []
            for s in range(kmax):
                t, c, e = self._pick(self._logits(f), T, seq.pkey, o * STEP_KEYS + s)
                toks.append(t); confs.append(c); ents.append(e)
                if s + 1 < kmax:
                    allow = _chain_allow(P - 1, n_seq, s + 1)[None, None]
                    f2, (kn, vn) = self.head.step(f[None], t[None], (P - 1 + s)[None], (kc, vc), allow)
                    kc, vc, f = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2), f2[0]
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out


# --------------------------------------------------------------------------------- cascade


class CascadeDrafter(Drafter):
    """A composition of drafters named earlier (`of=a+b`). rule=extend (default): a's draft,
    cut at its first token with conf < min_conf, then extended to k by b drafting after
    prefix + that cut (b must not need target features). rule=first: the first non-empty
    draft among of=..., in order."""
    kind = "cascade"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        of = self._setting("of", None, str)
        self.rule = self._setting("rule", "extend", str)
        self.min_conf = self._setting("min_conf", 0.5, float)  # extend: keep a's tokens while conf >= this
        self._check_settings({"of", "rule", "min_conf"})
        self.parts = of.split("+")
        missing = [p for p in self.parts if p not in env.drafters]
        if missing:
            raise HarnessError(f"--drafter {name}=cascade: of={of} names {missing}, which are not defined "
                               f"before it (defined: {sorted(env.drafters)})")
        if self.rule not in ("extend", "first"):
            raise HarnessError(f"--drafter {name}=cascade: rule={self.rule!r}; expected extend or first")
        if self.rule == "extend":
            if len(self.parts) != 2:
                raise HarnessError(f"--drafter {name}=cascade: rule=extend needs of=a+b (two drafters), got {of}")
            if getattr(env.drafters[self.parts[1]], "needs_features", False):
                raise HarnessError(f"--drafter {name}=cascade: {self.parts[1]} reads target features, "
                                   "so it cannot extend a draft; use a lookup drafter second")
        self.needs_features = any(getattr(env.drafters[p], "needs_features", False) for p in self.parts)
        self.drafters = [env.drafters[p] for p in self.parts]

    def start(self, workload, prompt_id):
        # the parts' per-prompt state (a draft model's cache) starts afresh with the cascade's prompt; their
        # finish() is not passed on: the engine finishes every drafter itself, and a suffix corpus would
        # receive each output twice
        for d in self.drafters:
            getattr(d, "start", lambda *a: None)(workload, prompt_id)

    def _extend(self, pre: Prefix, a: Draft, k: int) -> Draft:
        n = 0
        while n < len(a.tokens) and a.conf[n] >= self.min_conf:
            n += 1
        toks, conf, ent = a.tokens[:n], a.conf[:n], a.entropy[:n]
        q = None if a.q is None else a.q[:n]
        if n < k:
            ext = Prefix(pre.ids + toks, pre.n_prompt, pre.feats, pre.pkey, pre.temperature, pre.speculative + n)
            b = self.drafters[1].draft(ext, k - n)
            toks, conf, ent = toks + b.tokens, conf + b.conf, ent + b.entropy
            if q is not None or b.q is not None:
                q = (q if q is not None else [1.0] * n) + (b.q if b.q is not None else [1.0] * len(b.tokens))
        return Draft(toks, conf, ent, q)

    def draft(self, pre: Prefix, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        if self.rule == "first":
            for d in self.drafters:
                out = d.draft(pre, k)
                if out.tokens:
                    return out
            return Draft.empty()
        return self._extend(pre, self.drafters[0].draft(pre, k), k)

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        """Reuses the parts' dense drafts (computed first); only the extension runs here."""
        parts = [done[p] for p in self.parts]
        out = []
        for p, k in enumerate(seq.ks):
            if k <= 0:
                out.append(Draft.empty())
            elif self.rule == "first":
                out.append(next((d[p] for d in parts if d[p].tokens), Draft.empty()))
            else:
                out.append(self._extend(seq.prefix(p), parts[0][p], k))
        return out


# ------------------------------------------------------------------------------ CLI specs

BUILTIN = {c.kind: c for c in (NgramDrafter, SuffixDrafter, DraftModelDrafter, MedusaDrafter, EagleDrafter,
                               CascadeDrafter)}


def _value(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@dataclass
class DrafterSpec:
    name: str
    kind: str  # builtin kind, entry point name, or module.path:Class
    settings: dict

    def __str__(self):
        s = ",".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.name}={self.kind}" + (f":{s}" if s else "")


def _settings(text: str, where: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise HarnessError(f"{where}: setting {item!r} is not key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = _value(v.strip())
    return out


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def parse_spec(text: str) -> DrafterSpec:
    """NAME=KIND[:k=v,...] | NAME=module.path:Class[:k=v,...]; checks the kind exists."""
    where = f"--drafter {text}"
    if "=" not in text:
        raise HarnessError(f"{where}: expected NAME=KIND[:key=value,...]")
    name, rest = text.split("=", 1)
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise HarnessError(f"{where}: drafter name {name!r} must be letters, digits, - or _")
    head, _, tail = rest.partition(":")
    if head in BUILTIN or head in _entry_points():
        return DrafterSpec(name, head, _settings(tail, where))
    if tail and all(part.isidentifier() for part in head.split(".")):  # module.path:Class[:settings]
        cls, _, tail2 = tail.partition(":")
        if cls.isidentifier():  # settings always hold "=", a class name never does
            return DrafterSpec(name, f"{head}:{cls}", _settings(tail2, where))
    raise HarnessError(f"{where}: unknown drafter kind {head!r}; known kinds: {', '.join(sorted(BUILTIN))}"
                       f"; entry points ({ENTRY_POINT_GROUP}): {sorted(_entry_points()) or 'none'}"
                       "; or a plug-in as module.path:ClassName")


def resolve_class(kind: str):
    if kind in BUILTIN:
        return BUILTIN[kind]
    eps = _entry_points()
    if kind in eps:
        return eps[kind].load()
    mod, cls = kind.split(":")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise HarnessError(f"drafter plug-in {kind!r}: cannot import: {e}") from None


def build_drafters(specs: list[DrafterSpec], env: DrafterEnv) -> dict:
    """Instantiate in CLI order (a cascade may only name drafters given before it)."""
    out = {}
    for s in specs:
        if s.name in out:
            raise HarnessError(f"--drafter {s}: the name {s.name!r} is used twice")
        env.drafters = dict(out)
        out[s.name] = resolve_class(s.kind)(s.name, dict(s.settings), env)
    return out
