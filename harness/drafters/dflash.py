"""The DFlash block-diffusion drafter (`dflash`) on target layer outputs; the model itself in harness/models/dflash.py."""

from __future__ import annotations

import torch

from ..models import dflash, lm
from .base import STEP_KEYS, Draft, Prefix, Sequence, common_prefix
from .model import ModelDrafter


def _cat_kv(a: list, b: list) -> list:
    """Per-layer (k, v) caches joined along the key axis."""
    return [(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb) in zip(a, b)]


class DFlashDrafter(ModelDrafter):
    """DFlash (`path=`: z-lab's format, harness.models.dflash): one non-causal pass over the block
    [last token, mask x (block-1)] after context keys made from the target's states drafts
    block-1 tokens (`block=` overrides the checkpoint's block_size); a draft of k is the block's
    first min(k, block-1). Live drafting keeps the context keys of the prefix; dense drafting
    makes every position's context keys once and runs all origins' blocks together."""

    kind = "dflash"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        path = self._setting("path", None, str)
        self.batch = self._setting("batch", 64, int)  # origins per dense pass
        block = self._setting("block", 0, int)  # 0: the checkpoint's block_size
        self._check_settings({"path", "batch", "block"})
        self.path = lm.resolve_model_dir(path, env.models_root, f"--drafter {name}=dflash path")
        self.model = dflash.load(self.path, env.target, f"--drafter {name}=dflash:", block or None)
        self.max_len = self.model.block_size - 1  # the longest draft one pass gives
        self.ctx, self.ctx_ids = None, []  # per-layer context (k, v) over positions 0..n-1, and the ids then

    def feature_layers(self):
        return frozenset(self.model.keys)

    def info(self):
        return {"settings": {**self.settings, "block": self.model.block_size}, "sha256": lm.weights_sha256(self.path)}

    def start(self, workload, prompt_id):
        self.ctx, self.ctx_ids = None, []

    def _g(self, hidden: dict, lo: int, hi: int) -> torch.Tensor:
        return torch.cat([hidden[key][lo:hi] for key in self.model.keys], -1)

    def _pick_block(self, logits, T, pkey, o, ks) -> list[Draft]:
        """Drafts from block logits (M, block-1, V), origin o (M,), truncated to ks."""
        n = min(max(ks), self.max_len)
        toks, confs, ents = [], [], []
        for j in range(n):
            t, c, e = self._pick(logits[:, j], T, pkey, o * STEP_KEYS + j)
            toks.append(self.model.to_target(t))  # (a draft vocabulary's index -> the target's id)
            confs.append(c)
            ents.append(e)
        return self._assemble(toks, confs, ents, T, [min(k, n) for k in ks])

    @torch.no_grad()
    def draft(self, pre: Prefix, k: int) -> Draft:
        ids, P = pre.ids, len(pre.ids)
        if k <= 0 or P < 2:
            return Draft.empty()
        dev = pre.hidden[self.model.keys[0]].device
        cached = 0 if self.ctx is None else self.ctx[0][0].shape[2]
        keep = min(common_prefix(self.ctx_ids, ids), P - 1, cached)  # position j's keys need ids[: j + 1] unchanged
        ctx = [(k_[:, :, :keep], v_[:, :, :keep]) for k_, v_ in self.ctx] if keep else None
        for a, b in self._spans(P - 1 - keep):
            rows = torch.arange(keep + a, keep + b, device=dev)
            new = self.model.context(self._g(pre.hidden, keep + a, keep + b), rows)
            ctx = new if ctx is None else _cat_kv(ctx, new)
        self.ctx, self.ctx_ids = ctx, list(ids)
        logits = self.model.block(torch.tensor([ids[-1]], device=dev), torch.tensor([P - 1], device=dev), self.ctx)
        return self._pick_block(logits, pre.temperature, pre.pkey, torch.tensor([pre.pos], device=dev), [k])[0]

    @torch.no_grad()
    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        if self.exact:
            return self._naive(seq)
        npr, n_seq = seq.n_prompt, len(seq.ids) - 1
        dev = seq.hidden[self.model.keys[0]].device
        ctx = self.model.context(self._g(seq.hidden, 0, n_seq), torch.arange(n_seq, device=dev))
        ids = torch.tensor(seq.ids, device=dev)
        out = [Draft.empty() for _ in seq.ks]
        for orig in self._chunks(seq, max(0, 2 - npr)):
            o = torch.tensor(orig, device=dev)
            P = npr + o
            allow = torch.arange(n_seq, device=dev)[None, :] < (P - 1)[:, None]  # context 0..P-2
            logits = self.model.block(ids[P - 1], P - 1, ctx, allow)
            for m, d in zip(orig, self._pick_block(logits, seq.temperature, seq.pkey, o, [seq.ks[p] for p in orig])):
                out[m] = d
        self.ctx, self.ctx_ids = None, []
        return out
