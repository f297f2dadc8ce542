"""GGUF conversion faults (issue 35): every damaged or absurd header is one line naming the file and the field, before
transformers reads it, and nothing is written; a derandomized fuzz holds the header check to an independent rule."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.models import gguf_check
from harness.models.gguf import convert_gguf
from harness.models.lm import HarnessError
from tests.gguf_tiny import DEFAULTS, write_tiny

ROOT = Path(__file__).resolve().parents[1]


def refused(src: Path, tmp_path: Path, *words: str) -> str:
    dst = tmp_path / "out"
    with pytest.raises(HarnessError) as e:
        convert_gguf(src, dst)
    msg = str(e.value)
    assert str(src) in msg and all(w in msg for w in words) and "\n" not in msg, msg
    assert not dst.exists() and not list(tmp_path.glob(".out.tmp-*"))  # nothing written
    return msg


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"block_count": 0}, ("block_count", "1..")),
        ({"block_count": 999}, ("block_count", "blocks 0..1")),
        ({"context_length": 0}, ("context_length",)),
        ({"attention__layer_norm_rms_epsilon": -1.0}, ("layer_norm_rms_epsilon", "(0, 1)")),
        ({"rope__freq_base": float("nan")}, ("rope.freq_base", "finite")),
        ({"attention__head_count": 0}, ("head_count",)),
        ({"attention__head_count_kv": 0}, ("head_count_kv",)),
        ({"attention__head_count": 3}, ("head_count", "divide")),
        ({"bos_token_id": 2**32 - 1}, ("bos_token_id", "below 300")),
        ({"eos_token_id": 300}, ("eos_token_id",)),
    ],
)
def test_an_absurd_header_field_is_refused_before_loading(tmp_path, fields, words):
    refused(write_tiny(tmp_path / "m.gguf", layers=2, **fields), tmp_path, *words)


def test_a_block_count_above_the_tensors_is_refused(tmp_path):
    refused(write_tiny(tmp_path / "m.gguf", layers=1), tmp_path, "block_count", "blocks 0..0")


@pytest.mark.parametrize("keep", [20, 0.5])
def test_a_truncated_file_is_refused(tmp_path, keep):
    src = write_tiny(tmp_path / "m.gguf")
    data = src.read_bytes()
    src.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    refused(src, tmp_path, "not a readable GGUF file")


def _patch_after(data: bytes, key: bytes, fmt: str, value, skip: int = 0) -> bytes:
    i = data.index(key) + len(key) + skip
    return data[:i] + struct.pack(fmt, value) + data[i + struct.calcsize(fmt) :]


@pytest.mark.parametrize(
    "key, fmt, value, skip",
    [
        (b"llama.block_count", "<I", 99, 0),  # an unknown value-type code
        (b"token_embd.weight", "<I", 2**31, 0),  # a tensor of 2^31 dimensions
        (b"tokenizer.ggml.tokens", "<Q", 2**62, 12),  # the first token's length: 2^62 bytes
    ],
)
def test_a_damaged_header_is_refused(tmp_path, key, fmt, value, skip):
    src = write_tiny(tmp_path / "m.gguf")
    src.write_bytes(_patch_after(src.read_bytes(), key, fmt, value, skip))
    refused(src, tmp_path)


def test_the_command_says_one_line_and_exits_nonzero(tmp_path):
    src = write_tiny(tmp_path / "m.gguf", block_count=0)
    r = subprocess.run(
        [sys.executable, "specbandit_cli.py", "convert-checkpoint", str(src), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "block_count" in err[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_a_sound_tiny_file_converts_with_every_tensor_used(tmp_path):
    dst, done = convert_gguf(write_tiny(tmp_path / "m.gguf"), tmp_path / "out")
    assert done and (dst / "model.safetensors").is_file()


# ---------------------------------------------------------------- the header check against an independent rule

INTS = st.one_of(st.integers(-5, 40), st.sampled_from([0, 1, 2, 4, 8, 2**31, 2**32 - 1]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([1e-5, 1e4, -1.0]))


def sound(h: dict, layers: int, bos: int) -> bool:
    """The header a forward can run with, written independently of gguf_check."""
    d, heads, kv = h["embedding_length"], h["attention.head_count"], h["attention.head_count_kv"]
    eps, base = h["attention.layer_norm_rms_epsilon"], h["rope.freq_base"]
    return (
        h["block_count"] == layers
        and 1 <= h["context_length"] <= 2**24
        and all(1 <= h[k] <= 2**20 for k in ("embedding_length", "feed_forward_length"))
        and 1 <= kv <= heads <= 2**20
        and d % heads == 0
        and heads % kv == 0
        and math.isfinite(eps)
        and 0 < eps < 1
        and math.isfinite(base)
        and base > 0
        and 0 <= bos < 300
    )


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    block_count=st.integers(0, 4),
    context_length=INTS,
    heads=st.integers(0, 9),
    kv=st.integers(0, 9),
    eps=FLOATS,
    base=FLOATS,
    bos=st.sampled_from([0, 1, 299, 300, 2**32 - 1]),
)
def test_fuzz_header_check_agrees_with_an_independent_rule(
    tmp_path_factory, block_count, context_length, heads, kv, eps, base, bos
):
    fields = {
        "block_count": block_count,
        "context_length": max(0, min(context_length, 2**32 - 1)),
        "attention.head_count": heads,
        "attention.head_count_kv": kv,
        "attention.layer_norm_rms_epsilon": eps,
        "rope.freq_base": base,
    }
    src = write_tiny(
        tmp_path_factory.mktemp("fz") / "m.gguf",
        layers=2,
        bos_token_id=bos,
        **{k.replace(".", "__"): v for k, v in fields.items()},
    )
    h = {**DEFAULTS, **fields}
    h["attention.layer_norm_rms_epsilon"] = float(struct.unpack("<f", struct.pack("<f", eps))[0])
    h["rope.freq_base"] = float(struct.unpack("<f", struct.pack("<f", base))[0])
    try:
        gguf_check.check_header(src)
        ok = True
    except HarnessError as e:
        assert str(src) in str(e) and "\n" not in str(e)
        ok = False
    assert ok == sound(h, 2, bos), (h, bos)
