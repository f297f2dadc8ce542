"""The reference tiers (.ci/tiers.sh): tests against upstream drafter packages in environments of their own.

A test of tier NAME is marked `tier_NAME` and imports its package through `upstream(module)`: in the
main environment (no SPECBANDIT_TIER) a package that is not installed skips the test; in its own tier
(SPECBANDIT_TIER=NAME) a missing package is an error, so a broken tier cannot pass as skips.
"""

import importlib
import os

import pytest


def upstream(module: str, tier: str):
    if os.environ.get("SPECBANDIT_TIER") == tier:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"tier {tier} (bash .ci/tiers.sh {tier})")
