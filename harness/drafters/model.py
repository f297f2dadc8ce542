"""Model drafters: what every drafter that runs a network shares (ModelDrafter: choosing tokens with the
drafter's own noise stream, scoring them, the exact mode, dense chunks and chain masks), and the independent
small causal LM (`draft`, DraftModelDrafter)."""

from __future__ import annotations

import torch

from ..models import lm
from ..models.sampling import choose, conf_entropy, probs
from .base import STEP_KEYS, Draft, Drafter, Prefix, Sequence, common_prefix


def chain_allow(limit: torch.Tensor, n_seq: int, step: int) -> torch.Tensor:
    """Mask for step `step` (1-based) of M parallel draft chains after a cached sequence of
    n_seq keys and step-1 earlier chain blocks of M keys: chain m sees sequence keys
    < limit[m] and its own earlier chain tokens (an identity block per step)."""
    M = limit.shape[0]
    seq = torch.arange(n_seq, device=limit.device)[None, :] < limit[:, None]
    eye = torch.eye(M, dtype=torch.bool, device=limit.device)
    return torch.cat([seq] + [eye] * step, 1)


class ModelDrafter(Drafter):
    """Shared: choosing tokens with the drafter's own noise stream and scoring them.

    A chain drafter (draft, layerskip, eagle, eagle3: one forward per drafted token) may stop early:
    `stop_below=c` ends the chain after the first token whose confidence (its probability under the
    drafter's own distribution) is below c, that token kept, as transformers' assisted generation does with
    `assistant_confidence_threshold` (its default 0.4; transformers also adapts it as it goes, this does not).
    The forwards after that token are not run, so a live call costs fewer steps; a dense draft is the same
    chain truncated by the same rule (up to the rounding between a batched and a one-row forward, which can move a
    stop when a confidence lies that close to c). 0, the default, never stops."""

    stop_below = 0.0  # set by _read_stop in a chain drafter's __init__

    @property
    def exact(self) -> bool:
        return bool(getattr(self.env, "exact", False))

    def _spans(self, n: int) -> list[tuple[int, int]]:
        """How to feed n new positions: in one forward, or (exact) one forward each."""
        if n <= 0:
            return []
        return [(i, i + 1) for i in range(n)] if self.exact else [(0, n)]

    def _naive(self, seq: Sequence) -> list[Draft]:
        """Dense drafts by one live-style `draft` call per origin (the exact mode's dense)."""
        self.start("", "")
        return Drafter.dense(self, seq, {})

    def _read_stop(self) -> float:
        """The stop_below setting, checked (not written back: a drafter without it keeps its settings as they were)."""
        v = self.settings.get("stop_below", 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise lm.HarnessError(
                f"--drafter {self.name}={self.kind}: setting stop_below={v!r}: expected a number in [0, 1]"
            )
        return float(v)

    def _stopped(self, stopped: torch.Tensor | None, conf: torch.Tensor) -> torch.Tensor | None:
        """Which chains have stopped after a step with confidences conf (M,) (None: the rule is off). Compared in
        float64, as `_assemble` compares the recorded floats, so that a dense chain stops where a live one does."""
        if not self.stop_below:
            return None
        low = conf.double() < self.stop_below
        return low if stopped is None else stopped | low

    def _pick(self, logits: torch.Tensor, T: float, pkey: int, keys: torch.Tensor):
        tok = choose(logits, T, pkey, keys, self.stream)
        conf, ent = conf_entropy(probs(logits, T), tok)
        return tok, conf, ent

    def _assemble(self, toks, confs, ents, T, lens) -> list[Draft]:
        """Per-origin drafts from per-step tensors (steps, M), truncated to lens[m] and by the stop rule."""
        toks, confs, ents = (torch.stack(x).T.cpu().tolist() if x else [] for x in (toks, confs, ents))
        out = []
        for m, n in enumerate(lens):
            if self.stop_below and n:
                n = min(n, next((i + 1 for i, c in enumerate(confs[m]) if c < self.stop_below), n))
            t, c, e = (toks[m][:n], confs[m][:n], ents[m][:n]) if n else ([], [], [])
            out.append(Draft([int(x) for x in t], c, e, list(c) if T > 0 else None))
        return out

    def _chunks(self, seq: Sequence, first: int):
        """Origins with a non-empty draft, from origin `first`, in chunks of `batch`."""
        orig = [p for p, k in enumerate(seq.ks) if k > 0 and p >= first]
        for i in range(0, len(orig), self.batch):
            yield orig[i : i + self.batch]


class DraftModelDrafter(ModelDrafter):
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
        self._check_settings({"path", "batch", "stop_below"})
        self.stop_below = self._read_stop()
        where = f"--drafter {name}=draft path"
        self.path = lm.resolve_model_dir(path, env.models_root, where)
        lm.refuse_drafter_dir(self.path, where, name)  # before the tokenizer: a head directory has none
        lm.check_same_tokenizer(env.tokenizer, lm.load_tokenizer(self.path), str(env.target_path), str(self.path))
        self.model = lm.load_lm(self.path, env.device, env.dtype, where)
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
        common = common_prefix(self.cache_ids, ids)
        keep = min(common, P - 1, lm.cache_len(self.cache))
        lm.crop(self.cache, keep)
        dev = self.env.device
        for a, b in self._spans(P - keep):
            logits, _ = lm.forward(self.model, torch.tensor(ids[keep + a : keep + b], device=dev), self.cache)
        logits = logits[-1:]
        toks, confs, ents, stopped = [], [], [], None
        for j in range(k):
            key = torch.tensor([pre.pos * STEP_KEYS + j], device=dev)
            t, c, e = self._pick(logits, T, pre.pkey, key)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            stopped = self._stopped(stopped, c)
            if stopped is not None and bool(stopped.all()):
                break
            if j + 1 < k:
                logits, _ = lm.forward(self.model, t, self.cache)
        self.cache_ids = list(ids) + [int(t) for t in toks[:-1]]
        return self._assemble(toks, confs, ents, T, [k])[0]

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
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
            toks, confs, ents, stopped = [], [], [], None
            for j in range(kmax):
                t, c, e = self._pick(logits, T, seq.pkey, o * STEP_KEYS + j)
                toks.append(t)
                confs.append(c)
                ents.append(e)
                stopped = self._stopped(stopped, c)
                if stopped is not None and bool(stopped.all()):
                    break
                if j + 1 < kmax:
                    allow = chain_allow(npr + o, n_seq, j + 1)
                    logits, _ = lm.forward(self.model, t, cache, pos=npr + o + j, allow=allow)
            lm.crop(cache, n_seq)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.cache, self.cache_ids = None, []
        return out
