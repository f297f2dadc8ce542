"""The on-disk formats of the Medusa and EAGLE heads (harness/models/heads.py): our own, and the public layouts of the
reference implementations, read into our configs and key names.

Layouts the heads' `load` accepts (told apart by config.json, then the weight file's name):

  * ours: `config.json` (the config dataclass plus a `format` tag, MEDUSA_FORMAT or EAGLE_FORMAT)
    and `model.safetensors` (the head's own weights only; the target's embedding and `lm_head`
    are never saved, they come from the target passed to `load`).
  * Medusa-1 (FasterDecoding `medusa-llm`): `config.json` with `medusa_num_heads` and
    `medusa_num_layers`, weights `medusa_lm_head.safetensors` with keys `{i}.{j}.linear.{weight,bias}`
    (head i's residual block j) and `{i}.{L}.weight` (head i's vocabulary projection, L = layers).
  * EAGLE-1/2 (SafeAILab `eagle-llm`): a Llama `config.json` (`num_hidden_layers` 1, optional `bias`
    for fc, `qkv_bias`, `rope_theta`) and the weights of its `Model`: `fc.*`, `layers.0.*`
    (a decoder layer without input norm) and `embed_tokens.weight`, shipped as `pytorch_model.bin`
    and read here as `model.safetensors` after `specbandit convert-checkpoint` (harness/models/convert.py).

Nothing here unpickles: a directory that holds only `.bin`/`.pt` weights is refused with the
convert-checkpoint command to run. A missing or unexpected key is an error naming it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from .lm import HarnessError

MEDUSA_FORMAT = "specbandit-medusa-v1"
EAGLE_FORMAT = "specbandit-eagle-v1"
OURS_WEIGHTS = "model.safetensors"
MEDUSA1_WEIGHTS = "medusa_lm_head.safetensors"  # medusa-llm ships medusa_lm_head.pt: convert it
EAGLE1_WEIGHTS = "model.safetensors"  # eagle-llm ships pytorch_model.bin; convert-checkpoint names it so
PICKLED = (".bin", ".pt", ".pth")  # weight files that need torch's unpickler: never read here


def target_dims(target) -> tuple[int, int]:
    """(hidden_size, vocab_size) as the target's lm_head sees them."""
    w = target.get_output_embeddings().weight
    return int(w.shape[1]), int(w.shape[0])


def write_ours(dir_: str | Path, fmt: str, cfg, module: nn.Module) -> Path:
    d = Path(dir_)
    d.mkdir(parents=True, exist_ok=True)
    raw = {k: v for k, v in asdict(cfg).items() if k != "draft_vocab_size" or v}  # (the full vocabulary: unwritten)
    (d / "config.json").write_text(json.dumps({"format": fmt, **raw}, indent=2, sort_keys=True) + "\n")
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


def open_dir(dir_: str | Path, what: str) -> tuple[Path, dict]:
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


def load_state(module: nn.Module, state: dict, where: str) -> None:
    """Strict load with one-line errors naming the key (missing, unexpected, or of the wrong shape)."""
    own = module.state_dict()
    _check_keys(where, state, own)
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise HarnessError(f"{where}: key {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
    module.load_state_dict(state, strict=True)


def _check_dims(where: str, hidden: int, vocab: int, target) -> None:
    th, tv = target_dims(target)
    if (hidden, vocab) != (th, tv):
        raise HarnessError(f"{where}: head has hidden_size={hidden}, vocab_size={vocab} but the target has {th}, {tv}")


def read_ours(d: Path, raw: dict, fmt: str, cfg_cls, target, public: str):
    """Our format: the config dataclass from config.json, weights from model.safetensors."""
    if raw.get("format") != fmt:
        raise HarnessError(
            f"{d / 'config.json'}: field 'format' is {raw.get('format')!r}, expected {fmt!r} (or {public})"
        )
    names = {f.name for f in fields(cfg_cls)}
    cfg = cfg_cls(**{k: v for k, v in raw.items() if k in names})
    _check_dims(str(d / "config.json"), cfg.hidden_size, cfg.vocab_size, target)
    return cfg, _weights(d, OURS_WEIGHTS, fmt)


def place(module: nn.Module, target) -> nn.Module:
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
    draft_vocab_size: int = 0  # > 0: each head projects onto these target tokens only (`draft_ids`, saved)


def _int_field(raw: dict, key: str, where: Path, default=None) -> int:
    v = raw.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise HarnessError(f"{where}: field {key!r} is {v!r}, expected a positive integer")
    return v


def read_medusa1(d: Path, raw: dict, target) -> tuple[MedusaConfig, dict]:
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
    draft_vocab_size: int = 0  # > 0: logits over these target tokens only (the lm_head's rows `draft_ids`, saved)


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


def read_eagle1(d: Path, raw: dict, target) -> tuple[EagleConfig, dict]:
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
