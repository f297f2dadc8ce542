"""Our own draft-head formats on a target's hidden states: Medusa heads and an EAGLE head.

Both read the target's *feature* at a position: the last hidden state that the target's
`lm_head` consumes (`target(..., output_hidden_states=True).hidden_states[-1]`, i.e. after
the final norm), so `lm_head(feature[t])` are the target's logits for token `t+1`.

On disk a head is a directory with `config.json` (the config dataclass plus a `format`
tag) and `model.safetensors` (the head's own weights only; the target's embedding and
`lm_head` are never saved, they come from the target passed to `load`).

Drafting conventions (used by `harness/drafters.py`): for a prefix of length P the last
feature the target has computed in a speculative loop is at position P-2 (the last prefix
token is the bonus token of the previous verification, not yet fed to the target), so both
heads draft tokens P, P+1, ... from `feature[P-2]` and the tokens up to P-1.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

MEDUSA_FORMAT = "specbandit-medusa-v1"
EAGLE_FORMAT = "specbandit-eagle-v1"


def _target_dims(target) -> tuple[int, int]:
    """(hidden_size, vocab_size) as the target's lm_head sees them."""
    w = target.get_output_embeddings().weight
    return int(w.shape[1]), int(w.shape[0])


def _write(dir_: str | Path, fmt: str, cfg, module: nn.Module) -> Path:
    d = Path(dir_)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"format": fmt, **asdict(cfg)}, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(d / "model.safetensors"), metadata={"format": fmt})
    return d


def _read(dir_: str | Path, fmt: str, cfg_cls, target):
    d = Path(dir_)
    cfg_path, w_path = d / "config.json", d / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: missing (a {fmt} head directory needs config.json and model.safetensors)")
    raw = json.loads(cfg_path.read_text())
    if raw.get("format") != fmt:
        raise ValueError(f"{cfg_path}: field 'format' is {raw.get('format')!r}, expected {fmt!r}")
    names = {f.name for f in fields(cfg_cls)}
    cfg = cfg_cls(**{k: v for k, v in raw.items() if k in names})
    hidden, vocab = _target_dims(target)
    if (cfg.hidden_size, cfg.vocab_size) != (hidden, vocab):
        raise ValueError(f"{cfg_path}: head has hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size} "
                         f"but the target has {hidden}, {vocab}")
    return cfg, load_file(str(w_path))


def _place(module: nn.Module, target) -> nn.Module:
    p = next(target.parameters())
    return module.to(device=p.device, dtype=p.dtype).eval()


# ---------------------------------------------------------------------------------- Medusa


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 4  # longest draft one pass produces
    num_layers: int = 1  # residual blocks per head (Medusa-1 uses 1)
    share_lm_head: bool = False  # True: heads end in the target's lm_head (frozen, not saved)


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

    def __init__(self, cfg: MedusaConfig, lm_head: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(
            nn.Sequential(*[_ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)]) for _ in range(cfg.num_heads))
        if cfg.share_lm_head:
            if lm_head is None:
                raise ValueError("MedusaConfig.share_lm_head=True needs the target's lm_head")
            self.proj = None
        else:
            self.proj = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_heads))
            if lm_head is not None:
                for p in self.proj:
                    p.weight.data.copy_(lm_head.weight.data)
        object.__setattr__(self, "_lm_head", lm_head)  # not a submodule: never saved or trained here

    @classmethod
    def from_target(cls, target, **kw) -> "MedusaHeads":
        hidden, vocab = _target_dims(target)
        return _place(cls(MedusaConfig(hidden, vocab, **kw), target.get_output_embeddings()), target)

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
            losses.append(F.cross_entropy(logits[i - 1][:, :n].float().flatten(0, 1), ids[:, 1 + i:].flatten()))
        return torch.stack(losses).mean()

    def save(self, dir_: str | Path) -> Path:
        return _write(dir_, MEDUSA_FORMAT, self.cfg, self)

    @classmethod
    def load(cls, dir_: str | Path, target) -> "MedusaHeads":
        cfg, state = _read(dir_, MEDUSA_FORMAT, MedusaConfig, target)
        m = cls(cfg, target.get_output_embeddings())
        m.load_state_dict(state, strict=True)
        return _place(m, target)


# ----------------------------------------------------------------------------------- EAGLE


@dataclass
class EagleConfig:
    hidden_size: int
    vocab_size: int
    num_attention_heads: int = 4  # must divide hidden_size
    num_key_value_heads: int = 4  # grouped-query attention when smaller
    intermediate_size: int = 0  # 0: 4 * hidden_size
    rope_theta: float = 10000.0  # Llama's default
    rms_norm_eps: float = 1e-6


class _RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (Llama's rotate-half form); x (B, nh, Q, d), pos (B, Q)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None, :, None] * inv  # (B, 1, Q, d/2)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


class _LlamaLayer(nn.Module):
    """One Llama decoder layer written out here so that it does not depend on the
    transformers version; attention takes explicit positions, an optional key/value prefix
    and an optional boolean mask, which is what tree-shaped batched drafting needs."""

    def __init__(self, c: EagleConfig):
        super().__init__()
        h, self.nh, self.nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        if h % self.nh or self.nh % self.nkv:
            raise ValueError(f"EagleConfig: hidden_size={h}, num_attention_heads={self.nh}, "
                             f"num_key_value_heads={self.nkv} do not divide")
        self.hd, self.theta = h // self.nh, c.rope_theta
        inter = c.intermediate_size or 4 * h
        self.input_layernorm = _RMSNorm(h, c.rms_norm_eps)
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.post_attention_layernorm = _RMSNorm(h, c.rms_norm_eps)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x, pos, past=None, mask=None):
        """x (B, Q, H), pos (B, Q); past (k, v) each (B, nkv, Kp, d) or None; mask (B, 1, Q, Kp+Q)
        bool (True = attend) or None for causal over past+new. Returns (out, (k_new, v_new))."""
        B, Q, _ = x.shape
        y = self.input_layernorm(x)
        q = _rope(self.q_proj(y).view(B, Q, self.nh, self.hd).transpose(1, 2), pos, self.theta)
        k = _rope(self.k_proj(y).view(B, Q, self.nkv, self.hd).transpose(1, 2), pos, self.theta)
        v = self.v_proj(y).view(B, Q, self.nkv, self.hd).transpose(1, 2)
        kk, vv = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if mask is None:
            Kp = kk.shape[2] - Q
            mask = torch.ones(Q, Kp + Q, dtype=torch.bool, device=x.device).tril(Kp)[None, None]
        rep = self.nh // self.nkv
        a = F.scaled_dot_product_attention(q, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), attn_mask=mask)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, Q, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y)), (k, v)


class EagleHead(nn.Module):
    """EAGLE-1 style feature-level autoregressive head.

    Input at position t: the target feature f[t] and the embedding (the target's own input
    embedding, frozen) of token x[t+1], fused by `fc: Linear(2H, H)` over `cat([f, e])`;
    one Llama decoder layer (causal over positions, RoPE at position t) predicts the next
    feature f^[t+1]; `lm_head(f^[t+1])` (the target's lm_head) gives logits for x[t+2].
    Drafting feeds its own predicted feature and its own drafted token back in.

    Training (what `training_loss` does): run the frozen target on ids `x` (B, T) with
    `output_hidden_states=True`, `feats = hidden_states[-1]` detached. Call
    `pred = head(feats[:, :-1], x[:, 1:])` -> (B, T-1, H); targets: `pred[:, t] ~ feats[:, t+1]`
    (smooth L1, the EAGLE regression loss) and `lm_head(pred[:, t])` -> `x[:, t+2]` (cross
    entropy; weight `w_ce`, EAGLE uses 0.1). Positions are 0..T-2 with no offset.
    """

    def __init__(self, cfg: EagleConfig, embed: nn.Module | None = None, lm_head: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size)
        self.layer = _LlamaLayer(cfg)
        object.__setattr__(self, "_embed", embed)  # the target's modules: not saved, not trained here
        object.__setattr__(self, "_lm_head", lm_head)

    @classmethod
    def from_target(cls, target, **kw) -> "EagleHead":
        hidden, vocab = _target_dims(target)
        kw.setdefault("num_attention_heads", getattr(target.config, "num_attention_heads", 4) or 4)
        kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
        return _place(cls(EagleConfig(hidden, vocab, **kw), target.get_input_embeddings(),
                          target.get_output_embeddings()), target)

    def step(self, feats, next_ids, pos, past=None, mask=None):
        """Low-level: feats (B, Q, H), next_ids (B, Q) = token after each feature's position,
        pos (B, Q) positions of the features. Returns (predicted next features, (k, v))."""
        x = self.fc(torch.cat([feats, self._embed(next_ids)], -1))
        return self.layer(x, pos, past, mask)

    def forward(self, feats: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: feats (B, T, H) at positions 0..T-1, next_ids (B, T) -> (B, T, H)."""
        B, T, _ = feats.shape
        pos = torch.arange(T, device=feats.device).expand(B, T)
        return self.step(feats, next_ids, pos)[0]

    def logits(self, pred_feats: torch.Tensor) -> torch.Tensor:
        return self._lm_head(pred_feats)

    def training_loss(self, feats: torch.Tensor, ids: torch.Tensor, w_ce: float = 0.1) -> torch.Tensor:
        pred = self(feats[:, :-1], ids[:, 1:])
        reg = F.smooth_l1_loss(pred[:, :-1].float(), feats[:, 1:-1].float())
        ce = F.cross_entropy(self.logits(pred[:, :-1]).float().flatten(0, 1), ids[:, 2:].flatten())
        return reg + w_ce * ce

    def save(self, dir_: str | Path) -> Path:
        return _write(dir_, EAGLE_FORMAT, self.cfg, self)

    @classmethod
    def load(cls, dir_: str | Path, target) -> "EagleHead":
        cfg, state = _read(dir_, EAGLE_FORMAT, EagleConfig, target)
        m = cls(cfg, target.get_input_embeddings(), target.get_output_embeddings())
        m.load_state_dict(state, strict=True)
        return _place(m, target)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())

