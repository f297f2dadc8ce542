"""A tiny llama GGUF file written with the `gguf` package's own writer: what the conversion tests read.

`write_tiny(path, **fields)` writes 2 layers, width 8, a byte-level BPE vocabulary of 300 tokens; each keyword
overrides a header field (`block_count=0`, `attention.head_count=0`, `bos_token_id=2**32 - 1`, ...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ARCH = "llama"
DEFAULTS = {
    "block_count": 2,
    "context_length": 64,
    "embedding_length": 8,
    "feed_forward_length": 16,
    "attention.head_count": 2,
    "attention.head_count_kv": 1,
    "attention.layer_norm_rms_epsilon": 1e-5,
    "rope.freq_base": 10000.0,
}
VOCAB = ["a", "b", "ab", *(f"t{i}" for i in range(297))]


def write_tiny(path: Path, layers: int | None = None, seed: int = 0, **fields) -> Path:
    import gguf

    h = {**DEFAULTS, **{k.replace("__", "."): v for k, v in fields.items() if k.replace("__", ".") in DEFAULTS}}
    tok = {k: v for k, v in fields.items() if k.endswith("_token_id")}
    n_layers = h["block_count"] if layers is None else layers
    w = gguf.GGUFWriter(str(path), ARCH)
    for k, v in h.items():
        key = f"{ARCH}.{k}"
        if isinstance(v, float):
            w.add_float32(key, v)
        else:
            w.add_uint32(key, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * len(VOCAB))
    w.add_token_merges(["a b"])
    w.add_uint32("tokenizer.ggml.bos_token_id", tok.get("bos_token_id", 1))
    w.add_uint32("tokenizer.ggml.eos_token_id", tok.get("eos_token_id", 2))
    rng = np.random.default_rng(seed)
    d, ff = 8, 16
    kv = d // 2  # head_count_kv 1 of 2 heads of 4

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    t("token_embd.weight", len(VOCAB), d)
    for i in range(n_layers):
        t(f"blk.{i}.attn_norm.weight", d)
        t(f"blk.{i}.attn_q.weight", d, d)
        t(f"blk.{i}.attn_k.weight", kv, d)
        t(f"blk.{i}.attn_v.weight", kv, d)
        t(f"blk.{i}.attn_output.weight", d, d)
        t(f"blk.{i}.ffn_norm.weight", d)
        t(f"blk.{i}.ffn_gate.weight", ff, d)
        t(f"blk.{i}.ffn_up.weight", ff, d)
        t(f"blk.{i}.ffn_down.weight", d, ff)
    t("output_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
