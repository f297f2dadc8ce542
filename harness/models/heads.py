"""Draft heads on a target's hidden states: Medusa heads and an EAGLE head, in our own format and
in the public layouts of the reference implementations.

Both read the target's *feature* at a position: the last hidden state that the target's
`lm_head` consumes (`target(..., output_hidden_states=True).hidden_states[-1]`, i.e. after
the final norm), so `lm_head(feature[t])` are the target's logits for token `t+1`.

Their formats on disk (ours, Medusa-1 of medusa-llm, EAGLE-1/2 of eagle-llm) are read and written by
harness/models/head_formats.py; nothing there unpickles.

Drafting conventions (used by `harness/drafters/heads.py`): for a prefix of length P the last
feature the target has computed in a speculative loop is at position P-2 (the last prefix
token is the bonus token of the previous verification, not yet fed to the target), so both
heads draft tokens P, P+1, ... from `feature[P-2]` and the tokens up to P-1.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blocks import RMSNorm
from .head_formats import (
    EAGLE1_WEIGHTS,
    EAGLE_FORMAT,
    MEDUSA1_WEIGHTS,
    MEDUSA_FORMAT,
    OURS_WEIGHTS,
    EagleConfig,
    MedusaConfig,
    load_state,
    open_dir,
    place,
    read_eagle1,
    read_medusa1,
    read_ours,
    target_dims,
    write_ours,
)
from .lm import HarnessError


def _draft_ids(vd: int, vocab: int, ids: torch.Tensor | None) -> torch.Tensor | None:
    """The draft vocabulary's target ids (vd,) (zeros until loaded), or None for the full vocabulary."""
    if not vd:
        return None
    if not 0 < vd <= vocab:
        raise HarnessError(f"draft_vocab_size={vd}: must be in 1..{vocab} (the target's vocabulary)")
    if ids is None:
        return torch.zeros(vd, dtype=torch.long)
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.shape != (vd,) or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise HarnessError(f"draft vocabulary: {tuple(ids.shape)} ids, expected {vd} in 0..{vocab - 1}")
    return ids.clone()


class _ResBlock(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.linear = nn.Linear(h, h)
        nn.init.zeros_(self.linear.weight)  # start as identity, so every head starts as lm_head
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """Medusa-1 parallel heads: head i (1-based) maps the target feature at position t to
    logits for token t+1+i (the target's own lm_head is "head 0", predicting t+1).

    Each head is `num_layers` residual blocks `x + SiLU(W x + b)` and a projection to the
    vocabulary: its own Linear initialised from the target's lm_head, or (share_lm_head)
    the target's lm_head itself.

    Training (what `training_loss` does): run the frozen target on token ids `x` (B, T) with
    `output_hidden_states=True`, take `feats = hidden_states[-1]` (B, T, H), detached. Then
    `logits = heads(feats)` has shape (num_heads, B, T, V) and the target for
    `logits[i-1][:, t]` is `x[:, t+1+i]` (positions without a target are ignored). Cross
    entropy on the ground-truth corpus tokens is Medusa-1; using the target's own greedy
    continuation as `x` (self-distillation) matches the target better.
    """

    def __init__(self, cfg: MedusaConfig, lm_head: nn.Module | None = None, draft_ids: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(
            nn.Sequential(*[_ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)]) for _ in range(cfg.num_heads)
        )
        vd = cfg.draft_vocab_size
        self.register_buffer("draft_ids", _draft_ids(vd, cfg.vocab_size, draft_ids))
        if cfg.share_lm_head:
            if lm_head is None:
                raise ValueError("MedusaConfig.share_lm_head=True needs the target's lm_head")
            if vd:
                raise ValueError("MedusaConfig: share_lm_head and a draft vocabulary exclude each other")
            self.proj = None
        else:
            self.proj = nn.ModuleList(
                nn.Linear(cfg.hidden_size, vd or cfg.vocab_size, bias=False) for _ in range(cfg.num_heads)
            )
            if lm_head is not None:  # every head starts as the target's lm_head (its draft rows)
                rows = lm_head.weight.data if self.draft_ids is None else lm_head.weight.data[self.draft_ids]
                for p in self.proj:
                    p.weight.data.copy_(rows)
        object.__setattr__(self, "_lm_head", lm_head)  # not a submodule: never saved or trained here

    def to_target(self, d: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return d if self.draft_ids is None else self.draft_ids[d]

    @classmethod
    def from_target(cls, target, draft_ids=None, **kw) -> "MedusaHeads":
        hidden, vocab = target_dims(target)
        if draft_ids is not None:
            kw["draft_vocab_size"] = len(draft_ids)
        return place(cls(MedusaConfig(hidden, vocab, **kw), target.get_output_embeddings(), draft_ids), target)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats (..., H) -> logits (num_heads, ..., V)."""
        outs = []
        for i, blk in enumerate(self.blocks):
            z = blk(feats)
            outs.append(self._lm_head(z) if self.proj is None else self.proj[i](z))
        return torch.stack(outs)

    def training_loss(self, feats: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy over heads; feats (B, T, H) from the target on ids (B, T)."""
        logits = self(feats)
        losses = []
        for i in range(1, self.cfg.num_heads + 1):
            n = ids.shape[1] - 1 - i
            if n <= 0:
                break
            losses.append(F.cross_entropy(logits[i - 1][:, :n].float().flatten(0, 1), ids[:, 1 + i :].flatten()))
        return torch.stack(losses).mean()

    def save(self, dir_: str | Path) -> Path:
        return write_ours(dir_, MEDUSA_FORMAT, self.cfg, self)

    @classmethod
    def load(cls, dir_: str | Path, target) -> "MedusaHeads":
        """Our format or the Medusa-1 layout (harness/models/head_formats.py), by config.json."""
        d, raw = open_dir(dir_, "Medusa")
        if "medusa_num_heads" in raw and "format" not in raw:
            cfg, state = read_medusa1(d, raw, target)
            where = str(d / MEDUSA1_WEIGHTS)
        else:
            cfg, state = read_ours(
                d, raw, MEDUSA_FORMAT, MedusaConfig, target, "a Medusa-1 config with medusa_num_heads"
            )
            where = str(d / OURS_WEIGHTS)
        m = cls(cfg, target.get_output_embeddings())
        load_state(m, state, where)
        return place(m, target)


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (Llama's rotate-half form); x (B, nh, Q, d), pos (B, Q)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None, :, None] * inv  # (B, 1, Q, d/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


class _LlamaLayer(nn.Module):
    """One Llama decoder layer written out here so that it does not depend on the
    transformers version; attention takes explicit positions, an optional key/value prefix
    and an optional boolean mask, which is what tree-shaped batched drafting needs."""

    def __init__(self, c: EagleConfig):
        super().__init__()
        h, self.nh, self.nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        if h % self.nh or self.nh % self.nkv:
            raise HarnessError(
                f"EagleConfig: hidden_size={h}, num_attention_heads={self.nh}, "
                f"num_key_value_heads={self.nkv} do not divide"
            )
        self.hd, self.theta = h // self.nh, c.rope_theta
        inter = c.intermediate_size or 4 * h
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps) if c.input_norm else None
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=c.qkv_bias)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=c.qkv_bias)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=c.qkv_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x, pos, past=None, mask=None):
        """x (B, Q, H), pos (B, Q); past (k, v) each (B, nkv, Kp, d) or None; mask (B, 1, Q, Kp+Q)
        bool (True = attend) or None for causal over past+new. Returns (out, (k_new, v_new))."""
        B, Q, _ = x.shape
        y = x if self.input_layernorm is None else self.input_layernorm(x)
        q = _rope(self.q_proj(y).view(B, Q, self.nh, self.hd).transpose(1, 2), pos, self.theta)
        k = _rope(self.k_proj(y).view(B, Q, self.nkv, self.hd).transpose(1, 2), pos, self.theta)
        v = self.v_proj(y).view(B, Q, self.nkv, self.hd).transpose(1, 2)
        kk, vv = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if mask is None:
            Kp = kk.shape[2] - Q
            mask = torch.ones(Q, Kp + Q, dtype=torch.bool, device=x.device).tril(Kp)[None, None]
        rep = self.nh // self.nkv
        a = F.scaled_dot_product_attention(
            q, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), attn_mask=mask
        )
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, Q, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y)), (k, v)


class EagleHead(nn.Module):
    """EAGLE-1 style feature-level autoregressive head.

    Input at position t: the target feature f[t] and the embedding (the target's own input
    embedding, frozen; or the head's own with own_embedding) of token x[t+1], fused by
    `fc: Linear(2H, H)` over `cat([f, e])` (`cat([e, f])` with embed_first); one Llama decoder
    layer (causal over positions, RoPE at position t; no input norm with input_norm=False)
    predicts the next feature f^[t+1]; `lm_head(f^[t+1])` (the target's lm_head) gives logits
    for x[t+2]. Drafting feeds its own predicted feature and its own drafted token back in.
    With input_norm=False, embed_first=True (and the checkpoint's fc bias, qkv_bias, rope_theta)
    this is eagle-llm's `cnets.Model` with one layer, whose output goes to the base lm_head.

    Training (what `training_loss` does): run the frozen target on ids `x` (B, T) with
    `output_hidden_states=True`, `feats = hidden_states[-1]` detached. Call
    `pred = head(feats[:, :-1], x[:, 1:])` -> (B, T-1, H); targets: `pred[:, t] ~ feats[:, t+1]`
    (smooth L1, the EAGLE regression loss) and `lm_head(pred[:, t])` -> `x[:, t+2]` (cross
    entropy; weight `w_ce`, EAGLE uses 0.1). Positions are 0..T-2 with no offset.
    """

    def __init__(
        self,
        cfg: EagleConfig,
        embed: nn.Module | None = None,
        lm_head: nn.Module | None = None,
        draft_ids: torch.Tensor | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layer = _LlamaLayer(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.own_embedding else None
        self.register_buffer("draft_ids", _draft_ids(cfg.draft_vocab_size, cfg.vocab_size, draft_ids))
        object.__setattr__(self, "_embed", embed)  # the target's modules: not saved, not trained here
        object.__setattr__(self, "_lm_head", lm_head)
        object.__setattr__(self, "_rows", None)  # (the lm_head's draft rows, and what they were cut from)

    @classmethod
    def from_target(cls, target, draft_ids=None, **kw) -> "EagleHead":
        hidden, vocab = target_dims(target)
        kw.setdefault("num_attention_heads", getattr(target.config, "num_attention_heads", 4) or 4)
        kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
        if draft_ids is not None:
            kw["draft_vocab_size"] = len(draft_ids)
        emb, head = target.get_input_embeddings(), target.get_output_embeddings()
        return place(cls(EagleConfig(hidden, vocab, **kw), emb, head, draft_ids), target)

    def step(self, feats, next_ids, pos, past=None, mask=None):
        """Low-level: feats (B, Q, H), next_ids (B, Q) = token after each feature's position,
        pos (B, Q) positions of the features. Returns (predicted next features, (k, v))."""
        e = (self._embed if self.embed is None else self.embed)(next_ids).to(feats.dtype)
        x = self.fc(torch.cat([e, feats] if self.cfg.embed_first else [feats, e], -1))
        return self.layer(x, pos, past, mask)

    def forward(self, feats: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: feats (B, T, H) at positions 0..T-1, next_ids (B, T) -> (B, T, H)."""
        B, T, _ = feats.shape
        pos = torch.arange(T, device=feats.device).expand(B, T)
        return self.step(feats, next_ids, pos)[0]

    def logits(self, pred_feats: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (the target's whole vocabulary without one)."""
        if self.draft_ids is None:
            return self._lm_head(pred_feats)
        w = self._lm_head.weight
        key = (w.data_ptr(), w.dtype, w.device, self.draft_ids.data_ptr())
        if self._rows is None or self._rows[1] != key:  # cut once: the frozen target's rows of the draft vocabulary
            object.__setattr__(self, "_rows", (w.detach()[self.draft_ids].contiguous(), key))
        return F.linear(pred_feats, self._rows[0].to(pred_feats.dtype))

    def to_target(self, d: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return d if self.draft_ids is None else self.draft_ids[d]

    def training_loss(self, feats: torch.Tensor, ids: torch.Tensor, w_ce: float = 0.1) -> torch.Tensor:
        pred = self(feats[:, :-1], ids[:, 1:])
        reg = F.smooth_l1_loss(pred[:, :-1].float(), feats[:, 1:-1].float())
        ce = F.cross_entropy(self.logits(pred[:, :-1]).float().flatten(0, 1), ids[:, 2:].flatten())
        return reg + w_ce * ce

    def save(self, dir_: str | Path) -> Path:
        return write_ours(dir_, EAGLE_FORMAT, self.cfg, self)

    @classmethod
    def load(cls, dir_: str | Path, target) -> "EagleHead":
        """Our format or the EAGLE-1/2 layout (harness/models/head_formats.py), by config.json."""
        d, raw = open_dir(dir_, "EAGLE")
        if "format" not in raw and "num_hidden_layers" in raw:
            cfg, state = read_eagle1(d, raw, target)
            where = str(d / EAGLE1_WEIGHTS)
        else:
            cfg, state = read_ours(
                d, raw, EAGLE_FORMAT, EagleConfig, target, "an EAGLE-1/2 Llama config with num_hidden_layers"
            )
            where = str(d / OURS_WEIGHTS)
        m = cls(cfg, target.get_input_embeddings(), target.get_output_embeddings())
        load_state(m, state, where)
        return place(m, target)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
