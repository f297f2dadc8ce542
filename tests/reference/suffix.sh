# The suffix tier (.ci/tiers.sh suffix): arctic-inference 0.3.0's suffix tree (Snowflake's C++ SuffixDecoding,
# `arctic_inference.suffix_decoding`), built here from its sdist. Run by tiers.sh with PIP set to the venv's pip.
#
# Its build requirements (pyproject) are setuptools, wheel, ninja, cmake, nanobind==2.9.2, protobuf, grpcio-tools
# and torch>=2.10: an isolated build would fetch a CUDA torch, so the build runs --no-build-isolation against this
# environment's torch, with the C++ build tools installed first. protobuf/grpcio-tools only generate the gRPC
# stubs of its embedding server, which setup.py skips (with a message) when grpc_tools is absent; the suffix tree
# is one nanobind extension (csrc/suffix_decoding) that needs numpy at run time, nothing else. --no-deps: its
# runtime extras (vllm, ray, ...) are not needed for the suffix tree.
set -euo pipefail
read -r py _ <<< "$PIP"  # PIP is "<venv>/bin/python -m pip"
bin="$(cd "$(dirname "$py")" && pwd)"
$PIP install --quiet "setuptools>=61" wheel "cmake>=3.18" ninja "nanobind==2.9.2"
# setup.py runs `cmake` from PATH, and CMake's FindPython takes the first python3 on PATH: both must be the venv's
# (where nanobind is), not the system interpreter's
PATH="$bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$bin/python" \
  $PIP install --quiet --no-build-isolation --no-deps arctic-inference==0.3.0
