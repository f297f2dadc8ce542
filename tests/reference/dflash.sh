# The dflash tier (.ci/tiers.sh dflash): z-lab's dflash 0.1.0 (DFlashDraftModel, dflash_generate). Run by
# tiers.sh with PIP set to the tier venv's pip (a venv over this environment's torch, never reinstalled here).
#
# Requires-Dist: tqdm, datasets, requests (for its benchmark script) and, in the `local` extra only,
# torch==2.13.0 and transformers==5.15.0. dflash.model imports nothing but torch and transformers, and runs on
# this environment's transformers 5.24 (this tier's tests pass on it, dflash_generate included), so the wheel
# goes in with --no-deps.
set -euo pipefail
$PIP install --quiet --no-deps dflash==0.1.0
