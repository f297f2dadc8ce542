"""EAGLE-3 draft heads in the public formats, with a forward of our own (harness.models.blocks).

Formats read (by directory contents and config.json alone; no code from the checkpoint runs,
a `config.py` beside the weights is ignored):

* speculators (`speculators_model_type: "eagle3"`, what vLLM loads): `speculators_config` (the
  verifier's `name_or_path` and `proposal_methods[0].speculative_tokens`: vLLM refuses a config without
  it; our forward needs nothing from it), `transformer_layer_config`
  (a Llama or Qwen3 config of the draft layers), `draft_vocab_size`,
  `eagle_aux_hidden_state_layer_ids`, `norm_before_residual`, `norm_before_fc`, `fc_norm`,
  `norm_output`; weights `fc.weight`, `layers.N.*`, `norm.weight`, `lm_head.weight`, optional
  `embed_tokens.weight`, `d2t`/`t2d` when the draft vocabulary is smaller, `input_norm.weight`
  (norm_before_fc), `fc_norm.N.weight` (fc_norm).
* the original EAGLE-3 / SpecForge layout (`architectures: ["LlamaForCausalLMEagle3"]`, a flat
  Llama config with `draft_vocab_size` and optionally `eagle_config.eagle_aux_hidden_state_layer_ids`):
  the same tensors with `midlayer.*` for the one decoder layer.

The model. The target's hidden states at three layers, `hidden_states[i]` for i in the layer
ids (inputs of those decoder layers; i = L is the final post-norm state), concatenated per
position to (3 H_t,), go through `fc` to (H,). Decoder layer 0 takes `cat(input_layernorm(embed(x)),
hidden_norm(h))` (2H wide: its q/k/v projections are 2H -> heads), with the residual on h
(normed first when norm_before_residual); further layers are plain Llama/Qwen3 layers. The
output h' (normed when norm_output) is what the next step feeds back; logits are
`lm_head(norm(h'))` over the draft vocabulary, and draft token d is target token d + d2t[d].
vLLM 0.32 reads layer id L as the residual stream after the last layer *before* the final norm: a
head using id L drafts differently there (bench/vllm_heads.py gives vLLM heads on ids below L).

Positions, as speculators trains: the pair (target feature at t, token x[t+1]) sits at position
t+1 and predicts x[t+2]; chained step s after a prefix of P tokens sits at P-1+s.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from . import blocks, lm
from .lm import HarnessError

# training-only copies of the target's, and the target-to-draft mask (drafting needs only d2t)
IGNORED_KEYS = ("verifier_lm_head.weight", "verifier_norm.weight", "t2d")


def _layer_settings(raw: dict, where: str) -> tuple[dict, dict]:
    """(the decoder layers' config, the EAGLE-3 options) from either layout's config.json."""
    if raw.get("speculators_model_type") is not None:
        if raw["speculators_model_type"] != "eagle3":
            raise HarnessError(f"{where}: speculators_model_type is {raw['speculators_model_type']!r}, not eagle3")
        layer = dict(raw.get("transformer_layer_config") or {})
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
    else:
        layer = dict(raw)
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    opts = {k: bool(raw.get(k, False)) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")}
    if opts["norm_before_fc"] and opts["fc_norm"]:
        raise HarnessError(f"{where}: norm_before_fc and fc_norm are exclusive")
    opts["layer_ids"] = None if ids is None else [int(i) for i in ids]
    opts["draft_vocab_size"] = int(
        raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer.get("vocab_size", 0)
    )
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    miss = [k for k in need if k not in layer]
    if miss:
        raise HarnessError(f"{where}: the draft layer config lacks {miss}")
    if layer.get("model_type", "llama") not in ("llama", "qwen3"):
        raise HarnessError(
            f"{where}: draft layers of model_type {layer['model_type']!r} are not supported (llama, qwen3)"
        )
    blocks.check_act(layer, where)
    if any(t != "full_attention" for t in layer.get("layer_types") or []):
        raise HarnessError(f"{where}: sliding-window draft layers are not supported")
    return layer, opts


class Attention(nn.Module):
    def __init__(self, h_in: int, c: dict):
        super().__init__()
        h, self.nh = c["hidden_size"], c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads") or self.nh
        self.hd = c.get("head_dim") or h // self.nh
        bias = bool(c.get("attention_bias", False))
        self.q_proj = nn.Linear(h_in, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(h_in, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(h_in, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=bias)
        qk = c.get("model_type") == "qwen3"  # Qwen3 normalises each head's q and k before RoPE
        self.q_norm = blocks.RMSNorm(self.hd, c.get("rms_norm_eps", 1e-6)) if qk else None
        self.k_norm = blocks.RMSNorm(self.hd, c.get("rms_norm_eps", 1e-6)) if qk else None

    def _heads(self, x, proj, n, norm):
        B, Q, _ = x.shape
        y = proj(x).view(B, Q, n, self.hd)
        return (norm(y) if norm is not None else y).transpose(1, 2)

    def forward(self, x, cos, sin, past, mask):
        """x (B, Q, h_in); past (k, v) (B, nkv, K0, d) or None. Returns (B, Q, H), full (k, v)."""
        q = blocks.apply_rope(self._heads(x, self.q_proj, self.nh, self.q_norm), cos, sin)
        k = blocks.apply_rope(self._heads(x, self.k_proj, self.nkv, self.k_norm), cos, sin)
        v = self._heads(x, self.v_proj, self.nkv, None)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        if mask is None:
            mask = blocks.causal_after(q.shape[2], k.shape[2], x.device)
        return self.o_proj(blocks.attend(q, k, v, mask)), (k, v)


class Layer(nn.Module):
    def __init__(self, c: dict, first: bool, norm_before_residual: bool):
        super().__init__()
        h, eps = c["hidden_size"], c.get("rms_norm_eps", 1e-6)
        self.first, self.nbr = first, norm_before_residual
        self.self_attn = Attention(2 * h if first else h, c)
        self.mlp = blocks.MLP(h, c["intermediate_size"], bool(c.get("mlp_bias", False)))
        self.input_layernorm = blocks.RMSNorm(h, eps)
        self.post_attention_layernorm = blocks.RMSNorm(h, eps)
        if first:
            self.hidden_norm = blocks.RMSNorm(h, eps)

    def forward(self, x, emb, cos, sin, past, mask):
        if self.first:  # cat(embedding, hidden): the residual stream is the hidden half
            hn = self.hidden_norm(x)
            res = hn if self.nbr else x
            y = torch.cat([self.input_layernorm(emb), hn], -1)
        else:
            res, y = x, self.input_layernorm(x)
        a, kv = self.self_attn(y, cos, sin, past, mask)
        x = res + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Eagle3(nn.Module):
    """An EAGLE-3 head on a target (see the module's doc). `keys`: the target hidden states
    (harness.models.lm tap keys) it reads, in fc order."""

    def __init__(self, layer: dict, opts: dict, n_target_layers: int, t_hidden: int, own_embed: bool):
        super().__init__()
        h, eps = layer["hidden_size"], layer.get("rms_norm_eps", 1e-6)
        L = n_target_layers
        ids = opts["layer_ids"] if opts["layer_ids"] is not None else [2, L // 2, L - 3]  # speculators' default
        self.layer_ids, self.keys = ids, [lm.hidden_state(i, L) for i in ids]
        self.norm_output, n = opts["norm_output"], len(ids)
        self.fc = nn.Linear(n * t_hidden, h, bias=False)
        self.input_norm = blocks.RMSNorm(n * t_hidden, eps) if opts["norm_before_fc"] else None
        self.fc_norm = nn.ModuleList(blocks.RMSNorm(t_hidden, eps) for _ in ids) if opts["fc_norm"] else None
        self.layers = nn.ModuleList(
            Layer(layer, i == 0, opts["norm_before_residual"]) for i in range(int(layer.get("num_hidden_layers", 1)))
        )
        self.norm = blocks.RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, opts["draft_vocab_size"], bias=False)
        self.embed_tokens = nn.Embedding(layer["vocab_size"], h) if own_embed else None
        self.register_buffer(
            "d2t",
            None
            if opts["draft_vocab_size"] == layer["vocab_size"]
            else torch.zeros(opts["draft_vocab_size"], dtype=torch.long),
        )
        hd = layer.get("head_dim") or h // layer["num_attention_heads"]
        self.freq = blocks.inv_freq(blocks.rope_params(layer, "eagle3"), hd)  # a plain attribute: stays float32
        object.__setattr__(self, "_target_embed", None)  # set by `load`: the target's, when there is none here

    def fuse(self, g: torch.Tensor) -> torch.Tensor:
        """Concatenated target states (..., n * H_t) -> the head's hidden input (..., H)."""
        if self.input_norm is not None:
            g = self.input_norm(g)
        if self.fc_norm is not None:
            g = torch.cat([nm(c) for nm, c in zip(self.fc_norm, g.chunk(len(self.fc_norm), -1))], -1)
        return self.fc(g)

    def embed(self, tok: torch.Tensor) -> torch.Tensor:
        return (self.embed_tokens if self.embed_tokens is not None else self._target_embed)(tok)

    def step(self, h, tok, pos, past=None, mask=None, logits: bool = True):
        """h (B, Q, H) hidden inputs, tok (B, Q) target token ids, pos (B, Q); past: per layer (k, v)
        or None; mask (B|1, 1, Q, K) bool or None (causal after past). Returns (h' (B, Q, H) to feed
        back, logits (B, Q, V_draft) float32 (None with logits=False: a trainer reads `head(h')` at the
        rows it scores), per layer (k, v) with past included)."""
        emb = self.embed(tok)
        cos, sin = blocks.rope_cos_sin(self.freq, pos, h.dtype)
        kv = []
        for i, layer in enumerate(self.layers):
            h, c = layer(h, emb, cos, sin, None if past is None else past[i], mask)
            kv.append(c)
        if self.norm_output:
            h = self.norm(h)
        return h, (self.head(h) if logits else None), kv

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (..., V_draft) float32 of step outputs h' (..., H)."""
        return self.lm_head(h if self.norm_output else self.norm(h)).float()

    def to_target(self, d: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return d if self.d2t is None else d + self.d2t[d]


def load(path: Path, target, where: str = "eagle3") -> Eagle3:
    """An EAGLE-3 directory in either layout, checked against the target, on its device and dtype."""
    raw = lm.read_config(path)
    if not raw:
        raise HarnessError(f"{where} {path}: no config.json")
    layer, opts = _layer_settings(raw, f"{where} {path}/config.json")
    state = blocks.read_weights(path, where)
    state = {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    t_hidden = int(target.get_output_embeddings().weight.shape[1])
    L = int(target.config.num_hidden_layers)
    V = int(target.get_output_embeddings().weight.shape[0])
    if int(layer["vocab_size"]) != V:
        raise HarnessError(f"{where} {path}: made for a vocabulary of {layer['vocab_size']} tokens; the target has {V}")
    try:
        m = Eagle3(layer, opts, L, t_hidden, "embed_tokens.weight" in state)
    except HarnessError as e:
        raise HarnessError(f"{where} {path}: {e}") from None
    if m.embed_tokens is None and int(layer["hidden_size"]) != t_hidden:
        raise HarnessError(
            f"{where} {path}: no embed_tokens.weight and the target's embedding is {t_hidden} wide, "
            f"not {layer['hidden_size']}"
        )
    if "fc.weight" in state and state["fc.weight"].shape[1] != m.fc.weight.shape[1]:
        raise HarnessError(
            f"{where} {path}: fc takes {state['fc.weight'].shape[1]} inputs, but the layer ids "
            f"{m.layer_ids} on a target {t_hidden} wide give {m.fc.weight.shape[1]}"
        )
    blocks.load_strict(m, state, f"{where} {path}", IGNORED_KEYS)
    p = next(target.parameters())
    object.__setattr__(m, "_target_embed", target.get_input_embeddings())
    return m.to(device=p.device, dtype=p.dtype).eval()


def write_random(
    path: Path,
    target,
    layer_ids: list[int],
    draft_vocab: int | None = None,
    layout: str = "speculators",
    num_layers: int = 1,
    model_type: str = "llama",
    seed: int = 0,
    verifier: str | Path | None = None,
    speculative_tokens: int = 3,
) -> Path:
    """A random EAGLE-3 head for `target` in a public layout ("speculators" or "eagle3", the original
    EAGLE-3 / SpecForge one), for tests and benches: written as those tools write it (config.json and
    model.safetensors), read back only through `load`. draft_vocab < the target's: a d2t/t2d map
    over the target's first tokens and a random subset of the rest.

    The speculators layout is what speculators 0.9 `save_pretrained` writes and what vLLM 0.32 loads
    (tests/reference/test_eagle3_layout.py reads it with speculators, tests/reference/test_vllm_heads.py
    decodes with it in vLLM): `speculators_config` names the verifier (`verifier`: the target's directory,
    by default the one it was loaded from; vLLM serves that model when given the head's directory alone)
    and the draft length vLLM then uses (`speculative_tokens`); the target's embedding is stored as
    `embed_tokens.weight`, as speculators stores it, so that its loader starts from no random tensor."""
    head = target.get_output_embeddings().weight
    V, H = int(head.shape[0]), int(head.shape[1])
    Vd = draft_vocab or V
    nh = int(getattr(target.config, "num_attention_heads", 4))
    layer = {
        "model_type": model_type,
        "hidden_size": H,
        "intermediate_size": 2 * H,
        "num_hidden_layers": num_layers,
        "num_attention_heads": nh,
        "num_key_value_heads": int(getattr(target.config, "num_key_value_heads", nh)),
        "head_dim": H // nh,
        "vocab_size": V,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    opts = {
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "layer_ids": list(layer_ids),
        "draft_vocab_size": Vd,
    }
    g = torch.Generator().manual_seed(seed)
    m = Eagle3(layer, opts, int(target.config.num_hidden_layers), H, own_embed=False)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))
        keep = (
            torch.arange(V)
            if Vd == V
            else torch.cat([torch.arange(8), 8 + torch.randperm(V - 8, generator=g)[: Vd - 8].sort().values])
        )
        m.lm_head.weight.copy_(head.detach().float().cpu()[keep])  # the target's own rows: drafts can agree
        if m.d2t is not None:
            m.d2t.copy_(keep - torch.arange(Vd))
    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    if m.d2t is not None:
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[keep] = True
        state["t2d"] = t2d
    if layout == "speculators":
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float().cpu().contiguous()
        cfg = speculators_config(target, layer, opts, layer_ids, verifier, speculative_tokens)
    elif layout == "eagle3":
        cfg = {
            **layer,
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": Vd,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
        }
        state = {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in state.items()}
    else:
        raise ValueError(f"layout {layout!r}: speculators or eagle3")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def speculators_config(target, layer: dict, opts: dict, layer_ids, verifier, speculative_tokens: int) -> dict:
    """config.json of the speculators layout, as speculators 0.9's Eagle3SpeculatorConfig saves it. vLLM 0.32
    recognises a speculators checkpoint by `speculators_config` (a config without it has no model_type for
    transformers' AutoConfig: "Unrecognized model"), and reads `proposal_methods[0].speculative_tokens`
    and `verifier.name_or_path` from it (vllm/transformers_utils/configs/speculators/base.py)."""
    if verifier is None:
        verifier = getattr(target, "name_or_path", None) or getattr(target.config, "_name_or_path", None) or None
    if verifier is not None and Path(verifier).is_dir():  # a relative directory would depend on the cwd
        verifier = Path(verifier).resolve()
    if speculative_tokens < 1:
        raise ValueError(f"speculative_tokens={speculative_tokens}: must be >= 1")
    t_hidden = int(target.get_output_embeddings().weight.shape[1])
    arch = list(getattr(target.config, "architectures", None) or [type(target).__name__])
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(speculative_tokens),
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"name_or_path": None if verifier is None else str(verifier), "architectures": arch},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": opts["draft_vocab_size"],
        "target_hidden_size": t_hidden,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        **{k: opts[k] for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")},
    }
