"""Draft heads on a target's hidden states: Medusa heads and an EAGLE head, in our own format and
in the public layouts of the reference implementations.

Both read the target's *feature* at a position: the last hidden state that the target's
`lm_head` consumes (`target(..., output_hidden_states=True).hidden_states[-1]`, i.e. after
the final norm), so `lm_head(feature[t])` are the target's logits for token `t+1`.

Layouts `load` accepts (told apart by config.json, then the weight file's name):

  * ours: `config.json` (the config dataclass plus a `format` tag, MEDUSA_FORMAT or EAGLE_FORMAT)
    and `model.safetensors` (the head's own weights only; the target's embedding and `lm_head`
    are never saved, they come from the target passed to `load`).
  * Medusa-1 (FasterDecoding `medusa-llm`): `config.json` with `medusa_num_heads` and
    `medusa_num_layers`, weights `medusa_lm_head.safetensors` with keys `{i}.{j}.linear.{weight,bias}`
    (head i's residual block j) and `{i}.{L}.weight` (head i's vocabulary projection, L = layers).
  * EAGLE-1/2 (SafeAILab `eagle-llm`): a Llama `config.json` (`num_hidden_layers` 1, optional `bias`
    for fc, `qkv_bias`, `rope_theta`) and the weights of its `Model`: `fc.*`, `layers.0.*`
    (a decoder layer without input norm) and `embed_tokens.weight`, shipped as `pytorch_model.bin`
    and read here as `model.safetensors` after `specbandit convert-checkpoint` (harness/convert.py).

Nothing here unpickles: a directory that holds only `.bin`/`.pt` weights is refused with the
convert-checkpoint command to run. A missing or unexpected key is an error naming it.

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

from .blocks import RMSNorm
from .lm import HarnessError

MEDUSA_FORMAT = "specbandit-medusa-v1"
EAGLE_FORMAT = "specbandit-eagle-v1"
OURS_WEIGHTS = "model.safetensors"
MEDUSA1_WEIGHTS = "medusa_lm_head.safetensors"  # medusa-llm ships medusa_lm_head.pt: convert it
EAGLE1_WEIGHTS = "model.safetensors"  # eagle-llm ships pytorch_model.bin; convert-checkpoint names it so
PICKLED = (".bin", ".pt", ".pth")  # weight files that need torch's unpickler: never read here


def _target_dims(target) -> tuple[int, int]:
    """(hidden_size, vocab_size) as the target's lm_head sees them."""
    w = target.get_output_embeddings().weight
    return int(w.shape[1]), int(w.shape[0])


def _write(dir_: str | Path, fmt: str, cfg, module: nn.Module) -> Path:
    d = Path(dir_)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"format": fmt, **asdict(cfg)}, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(d / OURS_WEIGHTS), metadata={"format": fmt})
    return d


def _convert_error(d: Path, pickles: list[str]) -> HarnessError:
    return HarnessError(
        f"{d}: holds only pickled weights ({', '.join(pickles)}), which are never unpickled here; "
        f"convert them once to safetensors with `specbandit convert-checkpoint {d} DST` and load DST"
    )


def _pickles(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.suffix in PICKLED) if d.is_dir() else []


def _open(dir_: str | Path, what: str) -> tuple[Path, dict]:
    """(directory, its config.json as a dict); refuses pickle-only directories first."""
    d = Path(dir_)
    if _pickles(d) and not any(d.glob("*.safetensors")):
        raise _convert_error(d, _pickles(d))
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: missing (a {what} head directory needs config.json and its weights)")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise HarnessError(f"{cfg_path}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{cfg_path}: expected a JSON object")
    return d, raw


def _weights(d: Path, name: str, layout: str) -> dict[str, torch.Tensor]:
    p = d / name
    if not p.is_file() and _pickles(d):
        raise _convert_error(d, _pickles(d))
    if not p.is_file():
        raise FileNotFoundError(f"{p}: missing (the {layout} layout keeps its weights there)")
    return load_file(str(p))


def _check_keys(where: str, got, want) -> None:
    """Exactly the keys `want`: anything missing or unexpected is named (the first 6 of each)."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if "lm_head.weight" in extra and "model.embed_tokens.weight" in extra:  # a whole causal LM, not a head
        raise HarnessError(
            f"{where}: holds a causal LM (model.embed_tokens, lm_head), not a head; "
            "a small draft model is --drafter NAME=draft:path=DIR"
        )
    parts = [f"{what} key(s) {_few(xs)}" for what, xs in (("missing", missing), ("unexpected", extra)) if xs]
    if parts:
        raise HarnessError(f"{where}: " + "; ".join(parts))


def _few(xs: list[str], n: int = 6) -> str:
    return ", ".join(xs[:n]) + (f" (+{len(xs) - n} more)" if len(xs) > n else "")


def _load_state(module: nn.Module, state: dict, where: str) -> None:
    """Strict load with one-line errors naming the key (missing, unexpected, or of the wrong shape)."""
    own = module.state_dict()
    _check_keys(where, state, own)
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise HarnessError(f"{where}: key {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
    module.load_state_dict(state, strict=True)


def _check_dims(where: str, hidden: int, vocab: int, target) -> None:
    th, tv = _target_dims(target)
    if (hidden, vocab) != (th, tv):
        raise HarnessError(f"{where}: head has hidden_size={hidden}, vocab_size={vocab} but the target has {th}, {tv}")


def _read(d: Path, raw: dict, fmt: str, cfg_cls, target, public: str):
    """Our format: the config dataclass from config.json, weights from model.safetensors."""
    if raw.get("format") != fmt:
        raise HarnessError(
            f"{d / 'config.json'}: field 'format' is {raw.get('format')!r}, expected {fmt!r} (or {public})"
        )
    names = {f.name for f in fields(cfg_cls)}
    cfg = cfg_cls(**{k: v for k, v in raw.items() if k in names})
    _check_dims(str(d / "config.json"), cfg.hidden_size, cfg.vocab_size, target)
    return cfg, _weights(d, OURS_WEIGHTS, fmt)


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
            nn.Sequential(*[_ResBlock(cfg.hidden_size) for _ in range(cfg.num_layers)]) for _ in range(cfg.num_heads)
        )
        if cfg.share_lm_head:
            if lm_head is None:
                raise ValueError("MedusaConfig.share_lm_head=True needs the target's lm_head")
            self.proj = None
        else:
            self.proj = nn.ModuleList(
                nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_heads)
            )
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
            losses.append(F.cross_entropy(logits[i - 1][:, :n].float().flatten(0, 1), ids[:, 1 + i :].flatten()))
        return torch.stack(losses).mean()

    def save(self, dir_: str | Path) -> Path:
        return _write(dir_, MEDUSA_FORMAT, self.cfg, self)

    @classmethod
    def load(cls, dir_: str | Path, target) -> "MedusaHeads":
        """Our format or the Medusa-1 layout (see the module docstring), by config.json."""
        d, raw = _open(dir_, "Medusa")
        if "medusa_num_heads" in raw and "format" not in raw:
            cfg, state = _read_medusa1(d, raw, target)
            where = str(d / MEDUSA1_WEIGHTS)
        else:
            cfg, state = _read(d, raw, MEDUSA_FORMAT, MedusaConfig, target, "a Medusa-1 config with medusa_num_heads")
            where = str(d / OURS_WEIGHTS)
        m = cls(cfg, target.get_output_embeddings())
        _load_state(m, state, where)
        return _place(m, target)


def _int_field(raw: dict, key: str, where: Path, default=None) -> int:
    v = raw.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise HarnessError(f"{where}: field {key!r} is {v!r}, expected a positive integer")
    return v


def _read_medusa1(d: Path, raw: dict, target) -> tuple[MedusaConfig, dict]:
    """Medusa-1: head i = `nn.Sequential(ResBlock * L, Linear(H, V, bias=False))` saved as
    `{i}.{j}.linear.*` and `{i}.{L}.weight`; the maths is MedusaHeads' (share_lm_head=False).
    Returns our config and the state dict under our key names."""
    n = _int_field(raw, "medusa_num_heads", d / "config.json")
    L = _int_field(raw, "medusa_num_layers", d / "config.json", 1)
    st = _weights(d, MEDUSA1_WEIGHTS, "Medusa-1")
    rename = {f"{i}.{L}.weight": f"proj.{i}.weight" for i in range(n)}
    rename |= {
        f"{i}.{j}.linear.{p}": f"blocks.{i}.{j}.linear.{p}"
        for i in range(n)
        for j in range(L)
        for p in ("weight", "bias")
    }
    where = str(d / MEDUSA1_WEIGHTS)
    _check_keys(f"{where} (config.json: medusa_num_heads={n}, medusa_num_layers={L})", st, rename)
    vocab, hidden = st[f"0.{L}.weight"].shape  # (V, H)
    _check_dims(where, int(hidden), int(vocab), target)
    cfg = MedusaConfig(int(hidden), int(vocab), num_heads=n, num_layers=L, share_lm_head=False)
    return cfg, {rename[k]: v for k, v in st.items()}


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
    # Conventions, so that one class computes exactly what each public head computes
    # (ours: the defaults; EAGLE-1/2 of eagle-llm: input_norm=False, embed_first=True):
    input_norm: bool = True  # RMSNorm before attention (EAGLE's decoder layer 0 has none)
    embed_first: bool = False  # fc reads cat([embedding, feature]) (EAGLE), not cat([feature, embedding])
    fc_bias: bool = True  # fc has a bias (EAGLE: config "bias", default true)
    qkv_bias: bool = False  # q/k/v projections have biases (EAGLE for Qwen2: config "qkv_bias")
    own_embedding: bool = False  # the head carries (and saves) its own token embedding instead of the target's


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

    def __init__(self, cfg: EagleConfig, embed: nn.Module | None = None, lm_head: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layer = _LlamaLayer(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.own_embedding else None
        object.__setattr__(self, "_embed", embed)  # the target's modules: not saved, not trained here
        object.__setattr__(self, "_lm_head", lm_head)

    @classmethod
    def from_target(cls, target, **kw) -> "EagleHead":
        hidden, vocab = _target_dims(target)
        kw.setdefault("num_attention_heads", getattr(target.config, "num_attention_heads", 4) or 4)
        kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
        return _place(
            cls(EagleConfig(hidden, vocab, **kw), target.get_input_embeddings(), target.get_output_embeddings()), target
        )

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
        """Our format or the EAGLE-1/2 layout (see the module docstring), by config.json."""
        d, raw = _open(dir_, "EAGLE")
        if "format" not in raw and "num_hidden_layers" in raw:
            cfg, state = _read_eagle1(d, raw, target)
            where = str(d / EAGLE1_WEIGHTS)
        else:
            cfg, state = _read(
                d, raw, EAGLE_FORMAT, EagleConfig, target, "an EAGLE-1/2 Llama config with num_hidden_layers"
            )
            where = str(d / OURS_WEIGHTS)
        m = cls(cfg, target.get_input_embeddings(), target.get_output_embeddings())
        _load_state(m, state, where)
        return _place(m, target)


def _eagle1_config(raw: dict, where: Path) -> EagleConfig:
    """Our config with eagle-llm's conventions from its (Llama) config.json; refuses what
    EagleHead does not compute (more layers, another activation, RoPE scaling)."""
    if "draft_vocab_size" in raw:  # SafeAILab's EAGLE-3 writes the same Llama config plus a draft vocabulary
        raise HarnessError(f"{where}: an EAGLE-3 config (draft_vocab_size); use --drafter NAME=eagle3:path=...")
    for key, ok, want in (
        ("num_hidden_layers", raw.get("num_hidden_layers") == 1, "1"),
        ("hidden_act", raw.get("hidden_act", "silu") == "silu", "'silu'"),
        ("rope_scaling", raw.get("rope_scaling") is None, "null"),
    ):
        if not ok:
            raise HarnessError(f"{where}: field {key!r} is {raw.get(key)!r}; an EAGLE-1/2 head here needs {want}")
    heads = _int_field(raw, "num_attention_heads", where)
    # eagle-llm 1.2.1 always uses RoPE base 10000; later EAGLE releases read rope_theta when the config has one
    return EagleConfig(
        hidden_size=_int_field(raw, "hidden_size", where),
        vocab_size=_int_field(raw, "vocab_size", where),
        num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        intermediate_size=_int_field(raw, "intermediate_size", where),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        input_norm=False,
        embed_first=True,
        fc_bias=bool(raw.get("bias", True)),
        qkv_bias=bool(raw.get("qkv_bias", False)),
    )


def _eagle1_names(cfg: EagleConfig) -> dict[str, str]:
    """eagle-llm key -> our key (embed_tokens handled apart)."""
    names = {
        "fc.weight": "fc.weight",
        "layers.0.post_attention_layernorm.weight": "layer.post_attention_layernorm.weight",
    }
    if cfg.fc_bias:
        names["fc.bias"] = "fc.bias"
    for p in ("q", "k", "v", "o"):
        names[f"layers.0.self_attn.{p}_proj.weight"] = f"layer.{p}_proj.weight"
        if cfg.qkv_bias and p != "o":
            names[f"layers.0.self_attn.{p}_proj.bias"] = f"layer.{p}_proj.bias"
    for p in ("gate", "up", "down"):
        names[f"layers.0.mlp.{p}_proj.weight"] = f"layer.{p}_proj.weight"
    return names


def _read_eagle1(d: Path, raw: dict, target) -> tuple[EagleConfig, dict]:
    """EAGLE-1/2: returns our config (conventions set) and the state under our key names. The
    checkpoint's `embed_tokens.weight` (EAGLE trains with the base model's, frozen) is dropped
    when it equals the target's input embedding, else kept as the head's own embedding."""
    cfg = _eagle1_config(raw, d / "config.json")
    _check_dims(str(d / "config.json"), cfg.hidden_size, cfg.vocab_size, target)
    st = _weights(d, EAGLE1_WEIGHTS, "EAGLE-1/2")
    names = _eagle1_names(cfg)
    where = str(d / EAGLE1_WEIGHTS)
    _check_keys(where, st, set(names) | ({"embed_tokens.weight"} & set(st)))
    state = {names[k]: v for k, v in st.items() if k in names}
    emb = st.get("embed_tokens.weight")
    mine = target.get_input_embeddings().weight
    if emb is not None and not (emb.shape == mine.shape and torch.equal(emb.to(mine.device, mine.dtype), mine)):
        cfg.own_embedding = True
        state["embed.weight"] = emb
    return cfg, state


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
