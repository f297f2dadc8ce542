"""Transformer pieces written out in torch for the public drafter formats (harness/models/eagle3.py,
harness/models/dflash.py): RMSNorm, rotary embeddings from a transformers config dict, grouped-query
attention over explicit keys and a boolean mask, the gated MLP, and strict safetensors loading.

They follow the transformers Llama / Qwen3 definitions (RMSNorm in float32 then cast back,
`rotate_half` RoPE with cos/sin cast to the activations' dtype, SDPA with scale head_dim**-0.5)
so that a checkpoint computes what it was trained to compute, but they take positions, keys and
masks explicitly, which is what chained and block drafting need, and they do not depend on the
transformers version. No code is ever taken from a checkpoint directory.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from .lm import HarnessError


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_params(cfg: dict, where: str) -> dict:
    """{"rope_type", "rope_theta", ...} from a config dict (5.x `rope_parameters` or 4.x
    `rope_theta` + `rope_scaling`); only what `inv_freq` implements is accepted."""
    rp = dict(cfg.get("rope_parameters") or {})
    if not rp:
        rp = dict(cfg.get("rope_scaling") or {})
        rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = rp.get("rope_type", rp.get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3"):
        raise HarnessError(f"{where}: rope_type {kind!r} is not supported (default, linear, llama3)")
    if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise HarnessError(f"{where}: partial_rotary_factor {cfg['partial_rotary_factor']} is not supported")
    return {**rp, "rope_type": kind}


def inv_freq(rp: dict, dim: int) -> torch.Tensor:
    """Rotary inverse frequencies (dim/2,), float32, with linear or llama3 scaling as transformers does."""
    base = float(rp.get("rope_theta", 10000.0))
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rp["rope_type"] == "linear":
        return f / float(rp["factor"])
    if rp["rope_type"] == "llama3":
        factor, lo, hi = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
        old = float(rp["original_max_position_embeddings"])
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled)
    return f


def rope_cos_sin(freq: torch.Tensor, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, 1, Q, d) for positions pos (B, Q)."""
    ang = pos.to(torch.float32)[..., None] * freq.to(pos.device)  # (B, Q, d/2)
    emb = torch.cat([ang, ang], -1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, Q, d) rotated (transformers' rotate_half form)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def attend(q, k, v, mask) -> torch.Tensor:
    """q (B, nh, Q, d), k/v (B, nkv, K, d), mask (B|1, 1, Q, K) bool (True = attend) or None
    (everything visible). Returns (B, Q, nh*d)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def causal_after(q_len: int, k_len: int, device) -> torch.Tensor:
    """(1, 1, Q, K) bool: query i sees keys up to K-Q+i (a cache, then causal over the new ones)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)), Llama's and Qwen3's MLP."""

    def __init__(self, h: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=bias)
        self.up_proj = nn.Linear(h, inter, bias=bias)
        self.down_proj = nn.Linear(inter, h, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def check_act(cfg: dict, where: str) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise HarnessError(f"{where}: hidden_act {act!r} is not supported (silu)")


def read_weights(path: Path, where: str) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's *.safetensors files (sharded checkpoints included)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise HarnessError(f"{where} {path}: no *.safetensors weights (only safetensors are loaded)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f))
        except (OSError, ValueError, RuntimeError) as e:
            raise HarnessError(f"{where} {f}: unreadable safetensors ({e})") from None
        dup = sorted(set(part) & set(state))
        if dup:
            raise HarnessError(f"{where} {f}: tensors also in another file: {dup[:4]}")
        state.update(part)
    return state


def load_strict(module: nn.Module, state: dict, where: str, ignore: tuple[str, ...] = ()) -> None:
    """Load `state` into `module`; a missing, unexpected or mis-shaped key is one HarnessError
    naming them (keys in `ignore` may be present and are dropped)."""
    state = {k: v for k, v in state.items() if k not in ignore}
    want = module.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    shape = sorted(k for k in set(want) & set(state) if tuple(want[k].shape) != tuple(state[k].shape))
    if missing or extra or shape:
        said = "; ".join(
            f"{what} {len(ks)}: {', '.join(ks[:4])}{' ...' if len(ks) > 4 else ''}"
            for what, ks in (("missing", missing), ("unexpected", extra), ("mis-shaped", shape))
            if ks
        )
        raise HarnessError(f"{where}: the weights do not match the model its config describes ({said})")
    module.load_state_dict({k: v.to(want[k].dtype) for k, v in state.items()}, strict=True)
