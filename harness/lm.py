"""Local causal LMs: resolve, load safely, hash, and run forwards that a cache can extend.

Loading never touches the network or runs checkpoint code: `local_files_only=True`,
`use_safetensors=True`, `trust_remote_code=False`. A model is named by a path or by a name
under a models root (`--models DIR`, else `$MACH_MODELS`, else `$SPECBANDIT_MODELS`).

The transformers cache API moved between 4.x and 5.x (the forward keyword `past_key_values`
became `cache`; `DynamicCache.crop(n)` with n > 0 means "keep n" in 4.x and is an error in
5.x). Everything here goes through `forward` and `crop`, which speak both: cropping always
passes a negative count ("remove this many"), which both versions read the same way.
"""
from __future__ import annotations

import hashlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

import torch

MODELS_ENV = ("MACH_MODELS", "SPECBANDIT_MODELS")  # MACH_MODELS is the research repo's convention
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HarnessError(RuntimeError):
    """A problem with the user's inputs, reported before any work starts."""


def models_root(cli_root: str | None = None) -> Path | None:
    if cli_root:
        return Path(cli_root)
    for var in MODELS_ENV:
        if os.environ.get(var):
            return Path(os.environ[var])
    return None


def resolve_model_dir(spec: str, root: str | None = None, what: str = "model") -> Path:
    """A path if it exists, else `<models root>/<spec>`; a HarnessError listing both otherwise."""
    tried = [Path(spec)]
    r = models_root(root)
    if r is not None and not Path(spec).is_absolute():
        tried.append(r / spec)
    for p in tried:
        if p.is_dir():
            if not any(p.glob("*.safetensors")):
                raise HarnessError(f"{what} {spec!r}: {p} has no *.safetensors weights (only safetensors are loaded)")
            return p
    roots = "--models, $" + ", $".join(MODELS_ENV)
    raise HarnessError(f"{what} {spec!r}: no such directory; looked in: {', '.join(map(str, tried))}"
                       + ("" if r is not None else f" (no models root set: {roots})"))


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)


def load_lm(path: Path, device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM
    if dtype not in DTYPES:
        raise HarnessError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    import transformers
    dkw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"  # renamed in 5.x
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, use_safetensors=True,
                                                 trust_remote_code=False, **{dkw: DTYPES[dtype]})
    if getattr(model, "_supports_cache_class", True) is False:  # 4.x families still on tuple caches
        raise HarnessError(f"{path}: {type(model).__name__} in transformers {transformers.__version__} has no "
                           "Cache-class support (needed for cropping and tree masks); use transformers >= 5")
    return model.to(device).eval()


def weights_sha256(path: Path) -> str:
    """sha256 over the directory's safetensors files (sorted by name) and config.json."""
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("config.json")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_same_tokenizer(tok_a, tok_b, where_a: str, where_b: str) -> None:
    if tok_a.get_vocab() != tok_b.get_vocab():
        va, vb = tok_a.get_vocab(), tok_b.get_vocab()
        diff = sorted(set(va.items()) ^ set(vb.items()), key=str)[:3]
        raise HarnessError(f"tokenizer mismatch: {where_b} ({len(vb)} tokens) does not share the target's "
                           f"tokenizer {where_a} ({len(va)} tokens); first differences: {diff}")


# ------------------------------------------------------------------------- forward helpers

_CACHE_KW: dict[type, str] = {}


def new_cache():
    from transformers import DynamicCache
    return DynamicCache()


def cache_len(cache) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


def crop(cache, keep: int) -> None:
    """Keep the first `keep` positions of a DynamicCache (both 4.x and 5.x semantics)."""
    n = cache_len(cache)
    if keep < n:
        cache.crop(-(n - keep))


def move_span(cache, dst: int, src: int, n: int) -> None:
    """Copy the cache's positions src..src+n-1 to dst..dst+n-1, then keep dst+n positions.

    After a tree verify the chains' keys lie one after another; the chain that advances
    the output need not be the first (best-of-N), and its keys were computed at the
    positions right after the prefix, so moving them there is exact."""
    if n and src != dst:
        layers = getattr(cache, "layers", None)
        pairs = ([(la.keys, la.values) for la in layers] if layers is not None
                 else list(zip(cache.key_cache, cache.value_cache)))  # 4.x
        for k, v in pairs:
            k[..., dst: dst + n, :] = k[..., src: src + n, :].clone()
            v[..., dst: dst + n, :] = v[..., src: src + n, :].clone()
    crop(cache, dst + n)


def forward(model, ids: torch.Tensor, cache, pos: torch.Tensor | None = None, allow: torch.Tensor | None = None,
            hidden: bool = False):
    """Run `model` on ids (Q,) after the `cache` (extended in place). pos (Q,): position ids
    (default: after the cache). allow (Q, cache+Q) bool: which keys each query may see
    (default causal); it becomes an additive 4D mask, the "custom mask" form that both 4.x and
    5.x pass through unchanged. Returns (logits (Q, V) float32, feats (Q, H) or None)."""
    kw = _CACHE_KW.get(type(model))
    if kw is None:
        kw = _CACHE_KW.setdefault(type(model), "cache" if "cache" in inspect.signature(model.forward).parameters
                                  else "past_key_values")
    n0 = cache_len(cache)
    if pos is None:
        pos = torch.arange(n0, n0 + ids.shape[0], device=ids.device)
    args = dict(input_ids=ids[None], position_ids=pos[None], use_cache=True, output_hidden_states=hidden)
    args[kw] = cache
    if allow is not None:
        dt = next(model.parameters()).dtype
        mask = torch.zeros(allow.shape, dtype=dt, device=ids.device)
        mask.masked_fill_(~allow, torch.finfo(dt).min)
        args["attention_mask"] = mask[None, None]
        args["cache_position"] = torch.arange(n0, n0 + ids.shape[0], device=ids.device)
    with torch.no_grad():
        out = model(**args)
    feats = out.hidden_states[-1][0] if hidden else None
    return out.logits[0].float(), feats


@dataclass
class Loaded:
    """A loaded model with where it came from."""
    name: str
    path: Path
    model: object
    tokenizer: object
    sha256: str
