"""Every drafter-selection policy of the toolkit, in one list: the classic bandits (bandit/policies/bandits.py),
the published per-request rules (bandit/policies/published.py), spec-select (bandit/policies/specselect.py) and the
production engines' own lookup-or-model rules (bandit/policies/engines.py).

    python bandit/policies/registry.py      # every policy on a small simulated campaign with ranking flips [SIM]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/registry.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

from bandit.policies.bandits import EXP3, UCB1, BasePolicy, Fixed, Hedge, NormalHedge, Random, StepTime
from bandit.policies.engines import (
    ENGINE_RULES,
    HVD,
    ArcticHybrid,
    LlamacppFirst,
    SglangHybrid,
    TrtllmSA,
    VllmNgramEagle,
)
from bandit.policies.published import EXP3Spec, HedgeCtx, HedgeQuery, LinUCB, ThompsonCtx, UCBSpec
from bandit.policies.specselect import SpecSelect, SpecTables

__all__ = [
    "ALL",
    "ENGINE_RULES",
    "EXP3",
    "HVD",
    "ArcticHybrid",
    "LlamacppFirst",
    "SglangHybrid",
    "TrtllmSA",
    "VllmNgramEagle",
    "UCB1",
    "BasePolicy",
    "EXP3Spec",
    "Fixed",
    "Hedge",
    "HedgeCtx",
    "HedgeQuery",
    "LinUCB",
    "NormalHedge",
    "Random",
    "SpecSelect",
    "SpecTables",
    "StepTime",
    "ThompsonCtx",
    "UCBSpec",
    "make_policies",
]

ALL = (
    UCB1, EXP3, Hedge, NormalHedge, UCBSpec, EXP3Spec, HedgeQuery, ThompsonCtx, HedgeCtx, LinUCB, SpecSelect, Random
) + ENGINE_RULES  # fmt: skip


def make_policies(random_state: int = 0) -> list[BasePolicy]:
    """One instance of every learning policy (baselines needing hindsight are built in core.py)."""
    return [cls(random_state=random_state) for cls in ALL]


if __name__ == "__main__":
    from bandit.policies.walk import policies_demo

    policies_demo(make_policies(), "registry")  # intervals: python bandit/core.py
