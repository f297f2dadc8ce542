"""DFlash block-diffusion drafters (z-lab's format), with a forward of our own (harness.models.blocks).

Format (by config.json and the weights alone; no code from the checkpoint runs): a Qwen3 config
of the draft layers plus `dflash_config: {mask_token_id, target_layer_ids}` (each may also sit
at the top level), `block_size`, `num_target_layers`, optional `input_embedding_scale`,
`output_multiplier`, `final_logit_softcapping`; weights `fc.weight`, `hidden_norm.weight`,
`layers.N.*` (Qwen3 layers: q/k norms), `norm.weight`. The embedding and the lm_head are the
target's, which are never stored.

The model. Context: for every position the target has computed, the target's
`hidden_states[id + 1]` for id in target_layer_ids (the outputs of those layers; the last
layer's is the final post-norm state) are concatenated, projected by `fc` and normed by
`hidden_norm` into c (H,); each draft layer's own k/v projections (k normed, RoPE at the
position) turn c into that layer's context keys and values. Block: after a prefix of P tokens,
the last token x[P-1] and block_size-1 mask tokens, embedded with the target's embedding
weights (times input_embedding_scale), sit at positions P-1 .. P-1+block_size-1; the draft
layers run over them with attention to all the context and, non-causally, to the whole block;
after the final norm the target's lm_head (times output_multiplier, soft-capped when asked) at
block position j >= 1 gives the logits of token P-1+j. One pass drafts block_size-1 tokens.

A draft vocabulary (our extension, EAGLE-3's convention; zoo/dflash_train.py writes it): `draft_vocab_size` in
dflash_config (or at the top level) and a `d2t` tensor (draft_vocab_size,) int64 in the weights; the lm_head is then
the target's rows d + d2t[d] only, the logits are over those draft_vocab_size tokens, and `to_target` maps a drafted
index back to the target's id. Without them the whole vocabulary, as z-lab's drafters have.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file
import torch.nn.functional as F

from . import blocks, lm
from .lm import HarnessError


class Layer(nn.Module):
    """A Qwen3 decoder layer whose attention also sees the context keys and values."""

    def __init__(self, c: dict):
        super().__init__()
        h, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads") or self.nh
        self.hd = c.get("head_dim") or h // self.nh
        bias = bool(c.get("attention_bias", False))
        attn = nn.Module()
        attn.q_proj = nn.Linear(h, self.nh * self.hd, bias=bias)
        attn.k_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        attn.v_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        attn.o_proj = nn.Linear(self.nh * self.hd, h, bias=bias)
        attn.q_norm = blocks.RMSNorm(self.hd, eps)
        attn.k_norm = blocks.RMSNorm(self.hd, eps)
        self.self_attn = attn
        self.mlp = blocks.MLP(h, c["intermediate_size"], bool(c.get("mlp_bias", False)))
        self.input_layernorm = blocks.RMSNorm(h, eps)
        self.post_attention_layernorm = blocks.RMSNorm(h, eps)

    def kv(self, x, cos, sin):
        """x (B, N, H) -> keys (RoPE'd) and values (B, nkv, N, d)."""
        B, N, _ = x.shape
        a = self.self_attn
        k = a.k_norm(a.k_proj(x).view(B, N, self.nkv, self.hd)).transpose(1, 2)
        return blocks.apply_rope(k, cos, sin), a.v_proj(x).view(B, N, self.nkv, self.hd).transpose(1, 2)

    def forward(self, x, cos, sin, ctx, mask):
        """x (M, B, H) block states; ctx (k, v) (1 | M, nkv, N, d); mask (M, 1, B, N+B) or None."""
        M, B, _ = x.shape
        a = self.self_attn
        y = self.input_layernorm(x)
        q = blocks.apply_rope(a.q_norm(a.q_proj(y).view(M, B, self.nh, self.hd)).transpose(1, 2), cos, sin)
        k, v = self.kv(y, cos, sin)
        kc, vc = ctx
        k = torch.cat([kc.expand(M, -1, -1, -1), k], 2)
        v = torch.cat([vc.expand(M, -1, -1, -1), v], 2)
        x = x + a.o_proj(blocks.attend(q, k, v, mask))
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlash(nn.Module):
    """A DFlash drafter on a target (see the module's doc). `keys`: the target hidden states
    (harness.models.lm tap keys) it reads, in fc order."""

    def __init__(
        self, c: dict, keys: list[str], block_size: int, mask_token_id: int, scales: dict, draft_vocab: int = 0
    ):
        super().__init__()
        h, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.keys, self.block_size, self.mask_token_id = keys, block_size, mask_token_id
        self.scales = scales  # input_embedding_scale, output_multiplier, final_logit_softcapping
        self.layers = nn.ModuleList(Layer(c) for _ in range(int(c["num_hidden_layers"])))
        self.fc = nn.Linear(len(keys) * h, h, bias=False)
        self.hidden_norm = blocks.RMSNorm(h, eps)
        self.norm = blocks.RMSNorm(h, eps)
        hd = c.get("head_dim") or h // c["num_attention_heads"]
        self.freq = blocks.inv_freq(blocks.rope_params(c, "dflash"), hd)  # a plain attribute: stays float32
        object.__setattr__(self, "_embed_w", None)  # the target's, set by `load`
        object.__setattr__(self, "_lm_head", None)  # the target's, or (draft vocabulary) a Linear over its rows
        if draft_vocab:
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))  # target id = d + d2t[d]
        else:
            self.d2t = None

    def to_target(self, d: torch.Tensor) -> torch.Tensor:
        """Drafted indices -> the target's token ids (the identity without a draft vocabulary)."""
        return d if self.d2t is None else d + self.d2t[d]

    def context(self, g: torch.Tensor, pos: torch.Tensor) -> list:
        """g (N, n * H) concatenated target states at positions pos (N,) -> per layer (k, v) (1, nkv, N, d)."""
        c = self.hidden_norm(self.fc(g))[None]
        cos, sin = blocks.rope_cos_sin(self.freq, pos[None], c.dtype)
        return [layer.kv(c, cos, sin) for layer in self.layers]

    def block(self, first: torch.Tensor, pos0: torch.Tensor, ctx: list, ctx_allow: torch.Tensor | None = None):
        """first (M,) the block's first token (the prefix's last), pos0 (M,) its position; ctx as from
        `context`; ctx_allow (M, N) bool: which context keys each block sees (None: all). Returns
        logits (M, block_size-1, V) float32 for the tokens at pos0+1 .. pos0+block_size-1."""
        M, B, dev = first.shape[0], self.block_size, first.device
        ids = torch.full((M, B), self.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = first
        x = F.embedding(ids, self._embed_w) * float(self.scales["input_embedding_scale"])
        pos = pos0[:, None] + torch.arange(B, device=dev)[None]
        cos, sin = blocks.rope_cos_sin(self.freq, pos, x.dtype)
        mask = None
        if ctx_allow is not None:  # the block sees itself whole (non-causal) and its own context
            mask = torch.cat([ctx_allow, torch.ones(M, B, dtype=torch.bool, device=dev)], 1)
            mask = mask[:, None, None, :].expand(M, 1, B, mask.shape[1])
        for layer, kv in zip(self.layers, ctx):
            x = layer(x, cos, sin, kv, mask)
        logits = self._lm_head(self.norm(x[:, 1:])).float() * float(self.scales["output_multiplier"])
        cap = self.scales["final_logit_softcapping"]
        if cap is not None and float(cap) > 0:
            logits = torch.tanh(logits / float(cap)) * float(cap)
        return logits


def _value(raw: dict, key: str, default=None):
    """dflash_config first, then the top level (as z-lab's loader reads them)."""
    return (raw.get("dflash_config") or {}).get(key, raw.get(key, default))


def _settings(raw: dict, where: str, n_target: int) -> dict:
    """Everything the model needs from config.json, checked; where names the file."""
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
    miss = [k for k in need if k not in raw]
    if miss:
        raise HarnessError(f"{where}: lacks {miss}")
    if "DFlash2" in " ".join(map(str, raw.get("architectures") or [])) or _value(raw, "conv_kernel_size") is not None:
        raise HarnessError(f"{where}: DFlash2 (convolutions and a candidate selector) is not supported")
    if any(t != "full_attention" for t in raw.get("layer_types") or []) or _value(raw, "is_causal"):
        raise HarnessError(f"{where}: sliding-window or causal DFlash layers are not supported")
    blocks.check_act(raw, where)
    ids, mask = _value(raw, "target_layer_ids"), _value(raw, "mask_token_id")
    if ids is None or mask is None:
        raise HarnessError(f"{where}: dflash_config needs target_layer_ids and mask_token_id")
    nt = raw.get("num_target_layers")
    if nt is not None and int(nt) != n_target:
        raise HarnessError(f"{where}: made for a target of {nt} layers; this target has {n_target}")
    keys = [lm.hidden_state(int(i) + 1, n_target) for i in ids]  # z-lab reads hidden_states[id + 1]
    scales = {
        "input_embedding_scale": _value(raw, "input_embedding_scale", 1.0),
        "output_multiplier": _value(raw, "output_multiplier", 1.0),
        "final_logit_softcapping": _value(raw, "final_logit_softcapping"),
    }
    dv = _value(raw, "draft_vocab_size")
    if dv is not None and (not isinstance(dv, int) or dv < 1):
        raise HarnessError(f"{where}: draft_vocab_size {dv!r}: expected a positive integer")
    return {
        "keys": keys,
        "draft_vocab": dv or 0,
        "block_size": int(_value(raw, "block_size", 16)),
        "mask_token_id": int(mask),
        "scales": scales,
    }


def load(path: Path, target, where: str = "dflash", block_size: int | None = None) -> DFlash:
    """A DFlash directory checked against the target, on its device and dtype (block_size: override)."""
    raw = lm.read_config(path)
    if not raw:
        raise HarnessError(f"{where} {path}: no config.json")
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    V, H = int(head.weight.shape[0]), int(head.weight.shape[1])
    try:
        s = _settings(raw, f"{path}/config.json", int(target.config.num_hidden_layers))
    except HarnessError as e:
        raise HarnessError(f"{where} {e}") from None
    if int(raw["hidden_size"]) != H:
        raise HarnessError(f"{where} {path}: hidden_size {raw['hidden_size']}, but the target's is {H}")
    if not 0 <= s["mask_token_id"] < V:
        raise HarnessError(f"{where} {path}: mask_token_id {s['mask_token_id']} is outside the target's {V} tokens")
    bs = block_size or s["block_size"]
    if bs < 2:
        raise HarnessError(f"{where} {path}: block size {bs}; it must be >= 2")
    if s["draft_vocab"] > V:
        raise HarnessError(f"{where} {path}: draft_vocab_size {s['draft_vocab']} exceeds the target's {V} tokens")
    m = DFlash(raw, s["keys"], bs, s["mask_token_id"], s["scales"], s["draft_vocab"])
    blocks.load_strict(m, blocks.read_weights(path, where), f"{where} {path}")
    p = next(target.parameters())
    m = m.to(device=p.device, dtype=p.dtype).eval()
    if m.d2t is not None:
        rows = torch.arange(len(m.d2t), device=p.device) + m.d2t
        if int(rows.min()) < 0 or int(rows.max()) >= V or len(set(rows.tolist())) != len(rows):
            raise HarnessError(f"{where} {path}: d2t maps outside the target's {V} tokens or twice to one token")
        head = draft_head(head, rows)
    object.__setattr__(m, "_embed_w", emb.weight)
    object.__setattr__(m, "_lm_head", head)
    return m


def draft_head(head: nn.Module, rows: torch.Tensor) -> nn.Linear:
    """A Linear over the target lm_head's `rows` (a copy: the draft vocabulary's logits cost rows/V of the full
    head's); frozen, like the head it copies."""
    w = head.weight.detach()[rows]
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    lin.weight.requires_grad_(False)
    return lin


def write_random(
    path: Path,
    target,
    target_layer_ids: list[int],
    block_size: int = 8,
    num_layers: int = 1,
    mask_token_id: int = 3,
    seed: int = 0,
    vocab_rows: list[int] | None = None,
) -> Path:
    """A random DFlash drafter for `target` in z-lab's layout (config.json with dflash_config, and
    model.safetensors), for tests, benches and the trainer; read back only through `load`. `vocab_rows`
    (ascending target ids): a draft vocabulary of those tokens (d2t)."""
    H = int(target.get_output_embeddings().weight.shape[1])
    nh = int(getattr(target.config, "num_attention_heads", 4))
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": H,
        "intermediate_size": 2 * H,
        "num_hidden_layers": num_layers,
        "num_attention_heads": nh,
        "num_key_value_heads": int(getattr(target.config, "num_key_value_heads", nh)),
        "head_dim": H // nh,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "vocab_size": int(target.get_output_embeddings().weight.shape[0]),
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "layer_types": ["full_attention"] * num_layers,
        "block_size": block_size,
        "num_target_layers": int(target.config.num_hidden_layers),
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
    }
    if vocab_rows is not None:
        cfg["dflash_config"]["draft_vocab_size"] = len(vocab_rows)
    L = int(target.config.num_hidden_layers)
    m = DFlash(
        cfg,
        [lm.hidden_state(i + 1, L) for i in target_layer_ids],
        block_size,
        mask_token_id,
        {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None},
        len(vocab_rows) if vocab_rows is not None else 0,
    )
    if vocab_rows is not None:
        m.d2t.copy_(torch.as_tensor(vocab_rows, dtype=torch.long) - torch.arange(len(vocab_rows)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(
        {k: v.contiguous() for k, v in m.state_dict().items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return path
