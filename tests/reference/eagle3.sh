# The eagle3 tier (.ci/tiers.sh eagle3): speculators 0.9.0, whose EAGLE-3 format is what vLLM loads. Run by
# tiers.sh with PIP set to the tier venv's pip (a venv over this environment's torch, never reinstalled here).
#
# The wheel declares its training and data-generation stack (torchvision, torchaudio, aiohttp, loguru, psutil,
# protobuf, ...) and pins transformers<=5.19 and datasets<=5.1. What `import speculators` and its
# Eagle3DraftModel really reach is openai, datasets and hs-connectors (modules the package __init__ imports
# eagerly); none of them needs torch. Its loader (Eagle3DraftModel.from_pretrained) on a checkpoint that names its
# verifier, as the ones harness.models.eagle3.write_random writes do (vLLM serves that verifier), also loads the verifier's
# lm_head and norm, through a module that imports loguru. The EAGLE-3 model runs on this environment's transformers
# 5.24 (this tier's tests pass on it), so the wheel goes in with --no-deps and no other transformers is installed.
set -euo pipefail
$PIP install --quiet --no-deps speculators==0.9.0
$PIP install --quiet "openai==3.57.0" "datasets==5.1.0" "hs-connectors==0.9.0" "loguru==0.7.3"
