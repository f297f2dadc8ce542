"""A lean forward for Llama-family targets: the same modules, the same ops in the same order, without the layers of
Python that transformers puts around them (issue 32).

transformers' forward of a decoder-only model passes every call through decorators that merge config defaults,
rename deprecated keywords and capture outputs, builds or preprocesses the attention mask, looks the attention
function up by name and runs every decoder layer through the gradient-checkpointing wrapper, and its DynamicCache
copies every layer's whole keys and values at each forward. For a small model on a CPU that is a visible share of a
one-token step (bench/floor.py times transformers' forward and this one side by side and profiles both).

`install(model)` gives a supported model (`unsupported(model)` says why not) a forward that calls the model's own
modules directly: the embedding, the rotary embedding module, each layer's RMSNorms, q/k/v/o projections (on
whatever kernels `harness.models.kernels` put them), `cache.update` and the MLP, then the final norm and lm_head.
The attention call takes the branch transformers' SDPA integration takes for the same inputs (one query: the
query heads packed per key head; a 4D additive mask: grouped-query attention kept when
TRANSFORMERS_SDPA_FORCE_GQA is set, else keys and values repeated; an empty cache and no mask: is_causal), so the
logits are bitwise those of transformers' forward (tests/test_fastpath.py checks torch.equal on every form the
harness uses, at float32 and bfloat16, on both kernel paths). Anything else (a 2D padding mask, a non-empty
cache with no mask, labels, embeddings as input, autograd recording) goes to the class's own forward unchanged.

Target hidden states ("taps", harness.models.lm.tapped) are recorded by this forward itself: forward hooks on the
decoder layers would not fire, since the layers' __call__ is not used; a hook on lm_head (the "last" state) does.
"""

from __future__ import annotations

import os
import types
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = ("LlamaForCausalLM",)  # classes whose forward this reproduces op for op (transformers 5.x)
_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"
_TAPS: "weakref.WeakKeyDictionary[nn.Module, tuple[dict, dict]]" = weakref.WeakKeyDictionary()  # model -> (want, got)


def unsupported(model: nn.Module) -> str | None:
    """Why the lean forward cannot stand in for `model`'s, or None when it can."""
    import transformers

    name = type(model).__name__
    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__}: the lean forward follows 5.x's Llama"
    if name not in SUPPORTED:
        return f"{name} is not one of {', '.join(SUPPORTED)}"
    c = model.config
    checks = (
        (getattr(c, "_attn_implementation", None) == "sdpa", f"attention {c._attn_implementation!r}, not sdpa"),
        (not getattr(c, "attention_bias", False) and not getattr(c, "mlp_bias", False), "biases in attention or MLP"),
        (int(getattr(c, "pretraining_tp", 1) or 1) == 1, "pretraining_tp > 1"),
        (getattr(c, "hidden_act", "silu") == "silu", f"hidden_act {getattr(c, 'hidden_act', None)!r}"),
        (
            len(model.model.layers) == int(c.num_hidden_layers),
            "a layer list that is not num_hidden_layers long",
        ),
    )
    return next((why for ok, why in checks if not ok), None)


def installed(model: nn.Module) -> bool:
    return getattr(model.__dict__.get("forward"), "__func__", None) is _lean


def install(model: nn.Module, fuse=None) -> bool:
    """Give `model` the lean forward (a bound method over the class's, so a copy of the model runs its own);
    False (and nothing changed) when `unsupported`. Idempotent. `fuse(owner, names, x)`: x through the linears
    `names` of `owner` as one product, the outputs side by side, or None where it cannot
    (harness.models.kernels.fused: prepacked oneDNN weights)."""
    if installed(model):
        if fuse is not None:
            model.__dict__["_specbandit_fuse"] = fuse
        return True
    if unsupported(model) is not None or "forward" in model.__dict__:  # (a compiled forward stays as it is)
        return False
    model.__dict__["_specbandit_fuse"] = fuse or _no_fuse
    model.forward = types.MethodType(_lean, model)
    return True


def uninstall(model: nn.Module) -> None:
    if installed(model):
        del model.forward
        model.__dict__.pop("_specbandit_fuse", None)


def _lean(self, *args, **kw):
    return _forward(self, type(self).forward.__get__(self), self.__dict__["_specbandit_fuse"], *args, **kw)


@contextmanager
def taps(model: nn.Module, want: dict, got: dict):
    """Within the block, the lean forward stores the inputs ("in:i") and outputs ("out:i") of decoder layers in
    `got`; `want` maps (kind, i) to the key (see harness.models.lm.tapped)."""
    _TAPS[model] = (want, got)
    try:
        yield got
    finally:
        _TAPS.pop(model, None)


class _Out:
    """What callers read of a causal LM's output: logits (B, Q, V) and the cache."""

    __slots__ = ("logits", "cache", "past_key_values")

    def __init__(self, logits, cache):
        self.logits, self.cache, self.past_key_values = logits, cache, cache


def _no_fuse(owner, names, x):
    return None


def _forward(model, full, fuse, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kw):
    cache = kw.pop("past_key_values", cache)
    rest = {k: v for k, v in kw.items() if k not in ("logits_to_keep", "use_cache", "cache_position")}
    logits_to_keep = kw.get("logits_to_keep", 0)
    n0 = 0 if cache is None else int(cache.get_seq_length())
    q = 0 if input_ids is None else input_ids.shape[-1]
    mask_ok = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.is_floating_point())
    lean = (
        not rest
        and input_ids is not None
        and position_ids is not None
        and cache is not None
        and kw.get("use_cache", True) is not False
        and mask_ok
        and (attention_mask is not None or q == 1 or n0 == 0)
        and isinstance(logits_to_keep, int)
        and not torch.is_grad_enabled()
    )  # (cache_position is not read: the cache's own length places the new keys at the same positions)
    if not lean:
        return full(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, **kw)
    want, got = _TAPS.get(model, ({}, {}))
    inner = model.model
    x = inner.embed_tokens(input_ids)
    cos, sin = inner.rotary_emb(x, position_ids=position_ids)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    force_gqa = os.environ.get(_FORCE_GQA, "0") == "1"
    B = x.shape[0]
    for i, layer in enumerate(inner.layers):
        key = want.get(("in", i))
        if key is not None:
            got[key] = x
        x = _layer(layer, x, cos, sin, attention_mask, cache, i, B, q, force_gqa, fuse)
        key = want.get(("out", i))
        if key is not None:
            got[key] = x
    x = inner.norm(x)
    if logits_to_keep:
        x = x[:, -logits_to_keep:, :]
    return _Out(model.lm_head(x), cache)


def _layer(layer, x, cos, sin, mask, cache, i, B, q, force_gqa, fuse):
    attn, mlp = layer.self_attn, layer.mlp
    residual = x
    h = layer.input_layernorm(x)
    shape = (B, q, -1, attn.head_dim)
    qkv = fuse(attn, ("q_proj", "k_proj", "v_proj"), h)
    if qkv is None:
        qs, ks, vs = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    else:
        qs, ks, vs = qkv.split([m.out_features for m in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
    qs, ks, vs = (t.view(shape).transpose(1, 2) for t in (qs, ks, vs))
    qs = (qs * cos) + (_rotate_half(qs) * sin)
    ks = (ks * cos) + (_rotate_half(ks) * sin)
    ks, vs = cache.update(ks, vs, i)
    h = _attend(attn, qs, ks, vs, mask, q, force_gqa)
    h = attn.o_proj(h.reshape(B, q, -1).contiguous())
    x = residual + h
    residual = x
    h = layer.post_attention_layernorm(x)
    gu = fuse(mlp, ("gate_proj", "up_proj"), h)
    if gu is None:
        return residual + mlp(h)
    gate, up = gu.split([mlp.gate_proj.out_features, mlp.up_proj.out_features], -1)
    return residual + mlp.down_proj(mlp.act_fn(gate) * up)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attend(attn, qs, ks, vs, mask, q, force_gqa):
    """transformers' sdpa_attention_forward for the three forms the lean forward takes (see the module's doc)."""
    rep = attn.num_key_value_groups
    extra = {}
    if rep > 1:
        if force_gqa or (mask is None and ks.shape[-1] == vs.shape[-1] <= 256):
            extra["enable_gqa"] = True
        elif q == 1:
            qs = qs.reshape(qs.shape[0], qs.shape[1] // rep, rep, qs.shape[-1])
        else:
            b, n, s, d = ks.shape
            ks = ks[:, :, None].expand(b, n, rep, s, d).reshape(b, n * rep, s, d)
            vs = vs[:, :, None].expand(b, n, rep, s, d).reshape(b, n * rep, s, d)
    out = F.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, dropout_p=0.0, scale=attn.scaling, is_causal=q > 1 and mask is None, **extra
    )
    out = out.reshape(out.shape[0], -1, q, vs.shape[-1])
    return out.transpose(1, 2).contiguous()


# ---------------------------------------------------------------------------------------------- the cache


def _grow_layer():
    from transformers.cache_utils import DynamicLayer

    class GrowLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views of a buffer with room to spare: a forward of q tokens
        writes q positions into it instead of copying the whole cache into a new tensor (`torch.cat`, what
        DynamicLayer does: for SmolLM2 after 300 positions, 14 MB copied per forward). Cropping keeps the view's
        prefix, as DynamicLayer's crop does; the buffer is made anew (twice the length, at least GROW_MIN) when full,
        when the batch or heads change, when the keys were replaced by another tensor (batch_select_indices), and
        outside inference mode when it was made inside (an inference tensor cannot be written there)."""

        _kb: torch.Tensor | None = None
        _vb: torch.Tensor | None = None

        def update(self, key_states, value_states, *args, **kwargs):
            if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
                self._kb = self._vb = None  # autograd saves these keys: in-place writes would break its graph
                return super().update(key_states, value_states, *args, **kwargs)
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            q = key_states.shape[-2]
            kb, vb = self._kb, self._vb
            if (
                kb is None
                or kb.shape[-2] < n + q
                or kb.shape[:2] != key_states.shape[:2]
                or kb.dtype != key_states.dtype
                or (n and (self.keys.data_ptr() != kb.data_ptr() or self.values.data_ptr() != vb.data_ptr()))
                or (kb.is_inference() and not torch.is_inference_mode_enabled())
            ):
                cap = max(GROW_MIN, 2 * (n + q))
                kb = key_states.new_empty(*key_states.shape[:2], cap, key_states.shape[-1])
                vb = value_states.new_empty(*value_states.shape[:2], cap, value_states.shape[-1])
                if n:
                    kb[..., :n, :] = self.keys
                    vb[..., :n, :] = self.values
                self._kb, self._vb = kb, vb
            kb[..., n : n + q, :] = key_states
            vb[..., n : n + q, :] = value_states
            self.keys, self.values = kb[..., : n + q, :], vb[..., : n + q, :]
            return self.keys, self.values

    return GrowLayer


GROW_MIN = 256  # positions a fresh buffer holds at least
_GROW: list = []


def new_cache():
    """A transformers DynamicCache (every method the harness uses: get_seq_length, crop, update,
    batch_select_indices) whose layers grow in place (see GrowLayer); on transformers 4.x a plain DynamicCache."""
    from transformers.cache_utils import Cache, DynamicCache

    try:
        from transformers.cache_utils import DynamicLayer  # noqa: F401  (transformers >= 5: caches of layers)
    except ImportError:  # 4.x: one DynamicCache of lists, which concatenates as it always did
        return DynamicCache()
    if not _GROW:
        layer = _grow_layer()

        class GrowCache(DynamicCache):
            def __init__(self):
                Cache.__init__(self, layer_class_to_replicate=layer)

        _GROW.append(GrowCache)
    return _GROW[0]()
