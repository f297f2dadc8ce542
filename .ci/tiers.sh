#!/usr/bin/env bash
# The reference tiers: tests against upstream implementations whose pins conflict with the main
# environment. Each tier NAME has tests/reference/NAME.sh, which installs the tier's packages into a
# venv of its own (.venv-tier-NAME, on top of this environment's torch: created with
# --system-site-packages, so no torch is ever installed into it), and tests/reference/test_NAME*.py,
# run there with SPECBANDIT_TIER=NAME (then a missing package is an error, not a skip).
#
#   bash .ci/tiers.sh            # every tier
#   bash .ci/tiers.sh eagle3     # one
set -euo pipefail
cd "$(dirname "$0")/.."
tiers=("$@")
if [ ${#tiers[@]} -eq 0 ]; then
  for f in tests/reference/*.sh; do tiers+=("$(basename "$f" .sh)"); done
fi
for t in "${tiers[@]}"; do
  venv=".venv-tier-$t"
  echo "== tier $t ($venv)"
  [ -x "$venv/bin/python" ] || python -m venv --system-site-packages "$venv"
  # shellcheck disable=SC1090
  PIP="$venv/bin/python -m pip" bash "tests/reference/$t.sh"
  SPECBANDIT_TIER="$t" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/reference -m "tier_$t"
done
