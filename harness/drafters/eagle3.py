"""The EAGLE-3 drafter (`eagle3`) on the target's states at three layers; the head itself in harness/models/eagle3.py."""

from __future__ import annotations

import torch

from ..models import eagle3, lm
from .base import STEP_KEYS, Draft, Prefix, Sequence, common_prefix
from .model import ModelDrafter, chain_allow


class Eagle3Drafter(ModelDrafter):
    """EAGLE-3 (`path=`: a speculators or EAGLE-3/SpecForge directory, harness.models.eagle3): reads the
    target's states at its three layers, drafts k tokens greedily (or by its own coupled noise)
    in a chain, each step feeding back its own hidden state and token; conf/entropy come from its
    own distribution over the draft vocabulary, its tokens are mapped to the target's by d2t.
    Live drafting keeps the head's KV cache over true pairs; dense drafting is teacher-forced
    like `eagle`, all origins' chains in one pass per step."""

    kind = "eagle3"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"path", "batch", "stop_below"})
        self.stop_below = self._read_stop()
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=eagle3 path")
        self.model = eagle3.load(self.path, env.target, f"--drafter {name}=eagle3:")
        self.kv, self.kv_ids = None, []  # per-layer cache over pairs 0..n-1, and the ids it covered

    def feature_layers(self):
        return frozenset(self.model.keys)

    def info(self):
        return {
            "settings": {**self.settings, "layers": list(self.model.layer_ids)},
            "sha256": lm.weights_sha256(self.path),
        }

    def start(self, workload, prompt_id):
        self.kv, self.kv_ids = None, []

    def _g(self, hidden: dict, rows: torch.Tensor) -> torch.Tensor:
        """The head's input at those positions: fc over the concatenated target states."""
        return self.model.fuse(torch.cat([hidden[key][rows] for key in self.model.keys], -1))

    def _chain(self, h, logits, kv, T, pkey, o, P, k, allow_at=None):
        """k chained steps from h (1, M, H) / logits (M, Vd) after cache kv; origins o (M,),
        prefix lengths P (M,). allow_at(s): the mask of step s (None: causal after kv). Fewer when every
        chain has stopped by the stop rule (ModelDrafter)."""
        toks, confs, ents, stopped = [], [], [], None
        for s in range(k):
            d, c, e = self._pick(logits, T, pkey, o * STEP_KEYS + s)
            t = self.model.to_target(d)
            toks.append(t)
            confs.append(c)
            ents.append(e)
            stopped = self._stopped(stopped, c)
            if stopped is not None and bool(stopped.all()):
                break  # every chain has stopped (stop_below): the steps after are not run
            if s + 1 < k:
                mask = None if allow_at is None else allow_at(s + 1)
                h, lg, kv = self.model.step(h, t[None], (P + s)[None], kv, mask)
                logits = lg[0]
        return toks, confs, ents

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P, T = pre.ids, len(pre.ids), pre.temperature
        if k <= 0 or P < 2:
            return Draft.empty()
        dev = pre.hidden[self.model.keys[0]].device
        cached = 0 if self.kv is None else self.kv[0][0].shape[2]
        keep = max(0, min(common_prefix(self.kv_ids, ids) - 1, P - 2, cached))  # pair j needs ids[: j + 2] unchanged
        past = None if keep == 0 else [(k_[:, :, :keep], v_[:, :, :keep]) for k_, v_ in self.kv]
        for a, b in self._spans(P - 1 - keep):
            j = torch.arange(keep + a, keep + b, device=dev)
            nxt = torch.tensor(ids[keep + a + 1 : keep + b + 1], device=dev)
            h, lg, past = self.model.step(self._g(pre.hidden, j)[None], nxt[None], (j + 1)[None], past)
        self.kv, self.kv_ids = past, list(ids)
        o, Pt = torch.tensor([pre.pos], device=dev), torch.tensor([P], device=dev)
        toks, confs, ents = self._chain(h[:, -1:], lg[0, -1:], self.kv, T, pre.pkey, o, Pt, k)
        return self._assemble(toks, confs, ents, T, [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        T, npr, n_seq = seq.temperature, seq.n_prompt, len(seq.ids) - 1
        dev = seq.hidden[self.model.keys[0]].device
        j = torch.arange(n_seq, device=dev)
        nxt = torch.tensor(seq.ids[1:], device=dev)
        hs, lgs, kv_seq = self.model.step(self._g(seq.hidden, j)[None], nxt[None], (j + 1)[None])
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            kmax = max(seq.ks[p] for p in orig)
            allow_at = lambda step, P=P: chain_allow(P - 1, n_seq, step)[None, None]
            # chain m sees pairs 0..P-2 and its own earlier chain tokens
            toks, confs, ents = self._chain(hs[:, P - 2], lgs[0, P - 2], kv_seq, T, seq.pkey, o, P, kmax, allow_at)
            for m, d in zip(orig, self._assemble(toks, confs, ents, T, [seq.ks[p] for p in orig])):
                out[m] = d
        self.kv, self.kv_ids = None, []
        return out
