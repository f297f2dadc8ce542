"""Local causal LMs: resolve, load safely, hash, and run forwards that a cache can extend.

Loading never touches the network or runs checkpoint code: `local_files_only=True`,
`use_safetensors=True`, `trust_remote_code=False`. A model is named by a path or by a name
under a models root (`--models DIR`, else `$MACH_MODELS`, else `$SPECBANDIT_MODELS`).

The transformers cache API moved between 4.x and 5.x (the forward keyword `past_key_values`
became `cache`; `DynamicCache.crop(n)` with n > 0 means "keep n" in 4.x and is an error in
5.x). Everything here goes through `forward` and `crop`, which speak both: cropping always
passes a negative count ("remove this many"), which both versions read the same way.

Target hidden states ("taps"). A drafter may read, besides the tokens, hidden states of the
target at every position it has computed. They are named by keys:

    "last"    the final post-norm hidden state, the input of lm_head (what our Medusa and
              EAGLE heads read); transformers' `hidden_states[-1]`
    "in:i"    the input of decoder layer i (0 = the embeddings); `hidden_states[i]`
    "out:i"   the output of decoder layer i; `hidden_states[i + 1]` for i < L-1 (for the last
              layer it is the raw output before the final norm, which transformers never returns)

`forward(..., taps=keys)` captures exactly those with forward hooks registered for that call
only, on the named decoder layers (and the lm_head for "last"): a layer nobody asked for costs
nothing, and no `output_hidden_states` tuple is ever built.
"""

from __future__ import annotations

import inspect
import json
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from bandit.logs.errors import InputError

MODELS_ENV = ("MACH_MODELS", "SPECBANDIT_MODELS")  # MACH_MODELS is the research repo's convention
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAST = "last"  # the tap key of the final post-norm hidden state (lm_head's input)


class HarnessError(InputError):
    """A problem with the user's inputs (a model, a setting, a run directory), said in one line."""


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
                pickled = sorted(q.name for q in p.iterdir() if q.suffix in (".bin", ".pt", ".pth"))
                hint = f"; convert its {pickled[0]} once: specbandit convert-checkpoint {p} DST" if pickled else ""
                raise HarnessError(
                    f"{what} {spec!r}: {p} has no *.safetensors weights (only safetensors are loaded){hint}"
                )
            return p
    roots = "--models, $" + ", $".join(MODELS_ENV)
    raise HarnessError(
        f"{what} {spec!r}: no such directory; looked in: {', '.join(map(str, tried))}"
        + ("" if r is not None else f" (no models root set: {roots})")
    )


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto`: bfloat16 on CUDA (what serving runs), float32 on CPU (where bf16 matmuls are slow)."""
    if dtype == "auto":
        return "bfloat16" if str(device).startswith("cuda") else "float32"
    if dtype not in DTYPES:
        raise HarnessError(f"--dtype {dtype!r}: expected auto or one of {', '.join(DTYPES)}")
    return dtype


def read_config(path: Path) -> dict:
    """config.json of a model directory as a dict ({} when there is none)."""
    f = Path(path) / "config.json"
    if not f.is_file():
        return {}
    try:
        raw = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"{f}: unreadable ({e})") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{f}: not a JSON object")
    return raw


# checkpoint formats that are not causal LMs, by what their config.json says, and how to name them
DRAFTER_FORMATS = {
    "dflash": ("a DFlash checkpoint", "dflash"),
    "eagle3": ("an EAGLE-3 checkpoint", "eagle3"),
    "specbandit-medusa-v1": ("our Medusa heads", "medusa"),
    "specbandit-eagle-v1": ("our EAGLE head", "eagle"),
}


def drafter_format(path: Path) -> str | None:
    """Which drafter-head format a directory holds (a key of DRAFTER_FORMATS), or None for anything else
    (a causal LM, or a speculators type we do not load, returned as 'speculators:<type>')."""
    cfg = read_config(path)
    arch = " ".join(map(str, cfg.get("architectures") or []))
    if "dflash_config" in cfg or "DFlash" in arch or cfg.get("speculators_model_type") == "dflash":
        return "dflash"
    if cfg.get("speculators_model_type") == "eagle3" or "Eagle3" in arch:
        return "eagle3"
    if cfg.get("speculators_model_type"):
        return f"speculators:{cfg['speculators_model_type']}"
    return cfg.get("format") if cfg.get("format") in DRAFTER_FORMATS else None


def refuse_drafter_dir(path: Path, what: str, name: str = "NAME") -> None:
    """A HarnessError when `path` holds a drafter format rather than a causal LM."""
    fmt = drafter_format(path)
    if fmt is None:
        return
    if fmt in DRAFTER_FORMATS:
        desc, kind = DRAFTER_FORMATS[fmt]
        raise HarnessError(f"{what} {path}: this is {desc}, not a causal LM: use --drafter {name}={kind}:path={path}")
    raise HarnessError(
        f"{what} {path}: this is a speculators checkpoint of type {fmt.split(':', 1)[1]!r}, "
        "which the harness does not load (eagle3 and dflash are supported)"
    )


def load_lm(path: Path, device: str = "cpu", dtype: str = "float32", what: str = "model"):
    """A causal LM whose weights cover it exactly: a missing, unexpected or mis-shaped key is refused
    (transformers would initialise the missing ones at random and carry on)."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype, device)
    refuse_drafter_dir(path, what)
    import transformers

    dkw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"  # renamed in 5.x
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path),
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
            **{dkw: DTYPES[dtype]},
        )
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        raise HarnessError(f"{what} {path}: cannot load as a causal LM: {str(e).splitlines()[0]}") from None
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        said = "; ".join(
            f"{k.split('_')[0]} {len(v)}: {', '.join(map(str, v[:4]))}{' ...' if len(v) > 4 else ''}"
            for k, v in bad.items()
            if v
        )
        raise HarnessError(
            f"{what} {path}: the weights do not cover {type(model).__name__} ({said}); refusing a partly random model"
        )
    if getattr(model, "_supports_cache_class", True) is False:  # 4.x families still on tuple caches
        raise HarnessError(
            f"{path}: {type(model).__name__} in transformers {transformers.__version__} has no "
            "Cache-class support (needed for cropping and tree masks); use transformers >= 5"
        )
    return model.to(device).eval()


def weights_sha256(path: Path) -> str:
    """The model's identity: its tensors and architecture fields, not its files (harness/models/identity.py)."""
    from .identity import model_sha256

    return model_sha256(path)


def check_same_tokenizer(tok_a, tok_b, where_a: str, where_b: str) -> None:
    if tok_a.get_vocab() != tok_b.get_vocab():
        va, vb = tok_a.get_vocab(), tok_b.get_vocab()
        diff = sorted(set(va.items()) ^ set(vb.items()), key=str)[:3]
        raise HarnessError(
            f"tokenizer mismatch: {where_b} ({len(vb)} tokens) does not share the target's "
            f"tokenizer {where_a} ({len(va)} tokens); first differences: {diff}"
        )


# ------------------------------------------------------------------------- forward helpers

_CACHE_KW: dict[type, str] = {}


def new_cache():
    """A DynamicCache whose layers grow in place (harness.models.fastpath.new_cache): the same numbers as
    transformers' DynamicCache, without copying the whole cache at every forward."""
    from .fastpath import new_cache as grow_cache

    return grow_cache()


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
        with torch.inference_mode():  # the cache's tensors are inference tensors (`forward`): written in that mode
            for k, v in _kv_pairs(cache):
                k[..., dst : dst + n, :] = k[..., src : src + n, :].clone()
                v[..., dst : dst + n, :] = v[..., src : src + n, :].clone()
    crop(cache, dst + n)


def move_rows(cache, dst: int, src: list[int]) -> None:
    """Copy the cache's positions src[0], src[1], ... to dst, dst+1, ..., then keep dst+len(src) positions.

    After a tree of drafts is verified, the accepted path's keys lie scattered over the tree's span; each was
    computed at its depth's position (P + depth - 1, the position it takes in the output), so gathering them
    right after the prefix is exact, as `move_span` is for a chain."""
    if src and src != list(range(dst, dst + len(src))):
        idx = torch.tensor(src)
        with torch.inference_mode():
            for k, v in _kv_pairs(cache):
                i = idx.to(k.device)
                k[..., dst : dst + len(src), :] = k[..., i, :]  # advanced indexing copies: no overlap hazard
                v[..., dst : dst + len(src), :] = v[..., i, :]
    crop(cache, dst + len(src))


def _kv_pairs(cache) -> list:
    layers = getattr(cache, "layers", None)
    return (
        [(la.keys, la.values) for la in layers] if layers is not None else list(zip(cache.key_cache, cache.value_cache))
    )  # 4.x


def kv_tail(cache, start: int) -> list:
    """Copies of every layer's (keys, values) from position `start` on: [(k, v)], each (B, nkv, S, d)."""
    return [(k[..., start:, :].clone(), v[..., start:, :].clone()) for k, v in _kv_pairs(cache)]


def kv_extend(cache, kv: list) -> None:
    """Append `kv_tail`'s copies after the cache's positions (the same layout a forward leaves)."""
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)


# ---------------------------------------------------------------------- target hidden states


def layer_in(i: int) -> str:
    return f"in:{i}"


def layer_out(i: int) -> str:
    return f"out:{i}"


def hidden_state(i: int, n: int) -> str:
    """The key of transformers' `hidden_states[i]` for a model of n decoder layers (0..n)."""
    if not 0 <= i <= n:
        raise HarnessError(f"hidden_states[{i}]: the target has {n} layers, so 0..{n}")
    return LAST if i == n else layer_in(i)


_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its decoder layers


def decoder_layers(model):
    """The model's decoder layers (the ModuleList of num_hidden_layers blocks), found once per model."""
    hit = _LAYERS.get(model)
    if hit is not None:
        return hit
    n = getattr(model.config, "num_hidden_layers", None)
    found = next((m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    if found is None:
        raise HarnessError(
            f"{type(model).__name__}: no ModuleList of its {n} decoder layers found, so layer "
            "hidden states cannot be tapped"
        )
    _LAYERS[model] = found
    return found


def parse_tap(key: str, n_layers: int) -> tuple[str, int]:
    """("last", -1) | ("in", i) | ("out", i), checked against the model's layer count."""
    if key == LAST:
        return LAST, -1
    kind, _, idx = str(key).partition(":")
    if kind not in ("in", "out") or not idx.lstrip("-").isdigit() or not 0 <= int(idx) < n_layers:
        raise HarnessError(
            f"target hidden state {key!r}: expected 'last', 'in:i' or 'out:i' with "
            f"0 <= i < {n_layers} (the target's decoder layers)"
        )
    return kind, int(idx)


def _first(x):
    return x if torch.is_tensor(x) else x[0]  # 4.x layers return tuples, 5.x a tensor


@contextmanager
def tapped(model, keys):
    """Within the block, forwards of `model` store the hidden states named by `keys` in the yielded
    dict (key -> (B, Q, H)); hooks exist only for the named layers and only within the block."""
    from . import fastpath

    got: dict = {}
    handles = []
    keys = set(keys or ())
    layers = decoder_layers(model) if keys - {LAST} else None
    want = {parse_tap(k, len(layers)): k for k in keys - {LAST}} if layers is not None else {}
    # the lean forward records the layers' states itself (their hooks never fire); transformers' forward by hooks
    with fastpath.taps(model, want, got):
        try:
            for key in keys:
                kind, i = parse_tap(key, len(layers) if layers is not None else 0)
                if kind == LAST:
                    handles.append(
                        model.get_output_embeddings().register_forward_pre_hook(
                            lambda mod, args, key=key: got.__setitem__(key, args[0])
                        )
                    )
                elif kind == "in":
                    handles.append(
                        layers[i].register_forward_pre_hook(
                            lambda mod, args, kw, key=key: got.__setitem__(
                                key, args[0] if args else kw["hidden_states"]
                            ),
                            with_kwargs=True,
                        )
                    )
                else:
                    handles.append(
                        layers[i].register_forward_hook(
                            lambda mod, args, out, key=key: got.__setitem__(key, _first(out))
                        )
                    )
            yield got
        finally:
            for h in handles:
                h.remove()


@contextmanager
def _gqa(on: bool):
    """Within the block, transformers' SDPA attention keeps grouped-query attention (`enable_gqa=True`) for a masked
    forward too. By default it does so only without a mask (one query after a cache: plain decoding) and otherwise
    copies every key and value of the cache once per query head group (`repeat_kv`): for a forward of k+1 tokens
    after a cache of c positions that is a copy of the whole cache per layer, the part of a verify forward that
    grows with the context and that generation never pays. torch's CPU flash-attention kernel takes the mask with
    enable_gqa and computes the same numbers bit for bit; on CUDA a masked enable_gqa falls back to the math kernel,
    so this is for the CPU only. transformers reads the switch (TRANSFORMERS_SDPA_FORCE_GQA) at each attention call;
    a version without it ignores it."""
    if not on or os.environ.get(_FORCE_GQA) == "1":
        yield
        return
    was = os.environ.get(_FORCE_GQA)
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        if was is None:
            del os.environ[_FORCE_GQA]
        else:
            os.environ[_FORCE_GQA] = was


_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def forward(
    model,
    ids: torch.Tensor,
    cache,
    pos: torch.Tensor | None = None,
    allow: torch.Tensor | None = None,
    hidden: bool = False,
    taps=None,
    causal: bool = False,
    last_logits: bool = False,
):
    """Run `model` on ids (Q,) after the `cache` (extended in place). pos (Q,): position ids
    (default: after the cache). allow (Q, cache+Q) bool: which keys each query may see
    (default causal); it becomes an additive 4D mask, the "custom mask" form that both 4.x and
    5.x pass through unchanged. causal=True (default positions, no allow): that form of the
    causal mask, built from a cached template (`_causal_mask`), where the model would build its
    own: the same mask (and the same numbers) at less cost. Returns (logits (Q, V) float32,
    feats): feats is the "last" hidden state (Q, H) with hidden=True, {key: (Q, H)} for the keys
    in `taps`, else None. The forward runs under torch.inference_mode (no autograd bookkeeping per
    op): logits, feats and the cache's new tensors are inference tensors, read anywhere but
    written in place only in that mode (`move_span` does), and to be cloned before autograd
    saves them. last_logits=True: logits of the last query only (1, V) where the model can skip the others
    (`logits_to_keep`) and the "last" state is not tapped: a prefill whose logits nobody reads, as transformers'
    generate prefills (the cache and every other tap are the same)."""
    kw = _CACHE_KW.get(type(model))
    if kw is None:
        kw = _CACHE_KW.setdefault(
            type(model), "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
    n0, q = cache_len(cache), ids.shape[0]
    if pos is None:
        pos = torch.arange(n0, n0 + q, device=ids.device)
    elif causal:
        raise ValueError("lm.forward: causal=True takes the default positions")
    args = dict(input_ids=ids[None], position_ids=pos[None], use_cache=True)
    args[kw] = cache
    keys = set(taps or ()) | ({LAST} if hidden else set())
    if last_logits and LAST not in keys and _keeps_logits(model):  # (the LAST tap is lm_head's input)
        args["logits_to_keep"] = 1
    if allow is not None:
        dt = _dtype(model)
        mask = torch.zeros(allow.shape, dtype=dt, device=ids.device)
        mask.masked_fill_(~allow, torch.finfo(dt).min)
        args["attention_mask"] = mask[None, None]
        args["cache_position"] = torch.arange(n0, n0 + q, device=ids.device)
    elif causal and q > 1:  # (one query after the cache sees every key: no mask)
        args["attention_mask"] = _causal_mask(_dtype(model), ids.device, n0, q)
        args["cache_position"] = pos
    gqa = q > 1 and ids.device.type == "cpu"  # a masked forward: grouped-query attention kept (`_gqa`)
    with torch.inference_mode(), tapped(model, keys) as got, _gqa(gqa):  # no autograd bookkeeping on any op
        out = model(**args)
    logits = out.logits[0].float()
    if taps is not None:
        return logits, {k: got[k][0] for k in taps}
    return logits, (got[LAST][0] if hidden else None)


_KEEP: dict = {}  # model class -> whether its forward takes logits_to_keep


def _keeps_logits(model) -> bool:
    """Whether the model's class takes logits_to_keep. Read from the class, not the instance: the answer is cached
    per class, and an instance's own forward (the lean one, `(*args, **kw)`) would answer for every instance."""
    keep = _KEEP.get(type(model))
    if keep is None:
        keep = _KEEP.setdefault(type(model), "logits_to_keep" in inspect.signature(type(model).forward).parameters)
    return keep


_DTYPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its parameters' dtype
_TRIU: dict = {}  # (dtype, device) -> (m, m): the dtype's minimum above the diagonal, 0 on and below it


def _dtype(model) -> torch.dtype:
    dt = _DTYPES.get(model)
    if dt is None:
        dt = _DTYPES[model] = next(model.parameters()).dtype
    return dt


def _causal_mask(dt: torch.dtype, device, n0: int, q: int) -> torch.Tensor:
    """(1, 1, q, n0 + q) additive: query i (at position n0 + i) sees keys 0..n0 + i."""
    key = (dt, str(device))
    t = _TRIU.get(key)
    if t is None or t.shape[0] < q:
        with torch.inference_mode():
            t = _TRIU[key] = torch.full((max(q, 64), max(q, 64)), torch.finfo(dt).min, dtype=dt, device=device).triu(1)
    mask = torch.zeros(1, 1, q, n0 + q, dtype=dt, device=device)
    mask[0, 0, :, n0:] = t[:q, :q]
    return mask


@dataclass
class Loaded:
    """A loaded model with where it came from."""

    name: str
    path: Path
    model: object
    tokenizer: object
    sha256: str
