"""The drafter protocol every drafter follows, its types, and what several families share.

A drafter proposes up to k tokens after a prefix (the prompt plus the target's output so far)
and says how sure it is of each. The protocol (subclass `Drafter`, or duck-type it):

    class MyDrafter(Drafter):
        kind = "mine"
        def __init__(self, name: str, settings: dict, env: DrafterEnv): ...
        def draft(self, pre: Prefix, k: int) -> Draft           # required
        def start(self, workload: str, prompt_id: str) -> None     # optional: a new prompt begins
        def finish(self, output: list[int]) -> None                # optional: the prompt's output is final
        def dense(self, seq: Sequence, done: dict) -> list[Draft]  # optional: drafts at every position at once
        def info(self) -> dict                                     # optional: {"settings": ..., "sha256": ...}

`Draft` holds `tokens`, `conf` (the drafter's probability of each token, or its own score in
[0, 1]), `entropy` (nats), and `q` (the probability the token was proposed with, for
`expected_accepted`; None for deterministic drafters). Drafts must be a deterministic function
of the prefix, the prompt key and the drafter's state from earlier prompts: that is what makes
dense logs equal to live runs.

Target hidden states. A drafter that reads them declares which, by `feature_layers()` (a set of
harness.models.lm tap keys: "last" = the final post-norm state, lm_head's input; "in:i" / "out:i" = the
input / output of decoder layer i); the default is {"last"} when the class sets
`needs_features = True`, else nothing. The engine computes the union of all drafters'
declarations once per target forward (forward hooks on those layers only) and passes them as
`Prefix.hidden[key]`, each (N >= len(ids)-1, H): rows 0..len(ids)-2 are the target's states at
those positions (the last prefix token is not yet fed to the target); `Prefix.feats` is
`hidden["last"]`.

The families (harness/drafters/__init__.py lists their modules) build on what is here: the protocol's types,
the noise keying (STEP_KEYS) and the helpers several families share. How the CLI names a drafter, and where
a new kind is registered: harness/drafters/registry.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bandit.logs.schema import common_prefix as common_prefix  # the drafters share it (re-exported)
from bandit.logs.schema import accepted_length, tree_depths

from ..models import lm
from ..models.lm import HarnessError
from ..models.sampling import stream_id

STEP_KEYS = 4096  # a drafter's noise at (origin pos, step j) is keyed pos * STEP_KEYS + j; k < STEP_KEYS


@dataclass
class Draft:
    tokens: list[int]
    conf: list[float]
    entropy: list[float]
    q: list[float] | None = None  # proposal probabilities; None = deterministic (point mass)
    # a tree of drafts: node i (tokens[i], conf[i], entropy[i]) hangs under node parents[i] (-1: the root, the
    # prefix's last token), parents before children; None: a chain (parents i - 1)
    parents: list[int] | None = None

    @staticmethod
    def empty() -> "Draft":
        return Draft([], [], [], None)

    @property
    def depth(self) -> int:
        """How far the draft reaches past the prefix: a chain's length, a tree's deepest node."""
        return len(self.tokens) if self.parents is None else max(tree_depths(self.parents), default=0)

    def accepted(self, y: list[int]) -> int:
        """Tokens accepted against the target's tokens y after the prefix (a tree: its accepted path's length)."""
        return accepted_length(self.tokens, self.parents, y)

    def cut(self, n: int) -> "Draft":
        """The first n tokens (a tree: its first n nodes, still a tree, since parents come before children)."""
        return Draft(self.tokens[:n], self.conf[:n], self.entropy[:n], None if self.q is None else self.q[:n],
                     None if self.parents is None else self.parents[:n])  # fmt: skip


@dataclass
class Prefix:
    ids: list[int]  # prompt + output so far
    n_prompt: int
    feats: torch.Tensor | None  # (N >= len(ids)-1, H): the "last" target state at positions 0..len(ids)-2
    pkey: int  # the prompt's noise key (sampling.prompt_key)
    temperature: float
    speculative: int = 0  # trailing ids that are draft tokens, not output (cascade extension)
    hidden: dict = field(default_factory=dict)  # tap key -> (N >= len(ids)-1, H): states at 0..len(ids)-2

    @property
    def pos(self) -> int:
        return len(self.ids) - self.n_prompt - self.speculative


@dataclass
class Sequence:
    """A finished prompt for dense drafting: origin pos has prefix ids[:n_prompt + pos]."""

    ids: list[int]
    n_prompt: int
    feats: torch.Tensor | None  # (len(ids)-1, H): the "last" target state at every position but the final one
    pkey: int
    temperature: float
    ks: list[int]  # draft length at each origin 0..N-1
    hidden: dict = field(default_factory=dict)  # tap key -> (len(ids)-1, H), as in Prefix

    def prefix(self, pos: int) -> Prefix:
        return Prefix(
            self.ids[: self.n_prompt + pos], self.n_prompt, self.feats, self.pkey, self.temperature, 0, self.hidden
        )


@dataclass
class DrafterEnv:
    target: object  # the target model (transformers PreTrainedModel)
    tokenizer: object
    target_path: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"
    models_root: str | None = None
    temperature: float = 0.0
    seed: int = 0
    drafters: dict = field(default_factory=dict)  # name -> drafter, those defined earlier
    # exact (with Target(exact=True), --exact-verify): model drafters feed one position per forward and
    # draft densely by the per-position loop, so that a dense draft is bit-identical to the live one at any
    # dtype (batched forwards of other shapes differ in the last bits, and bf16 near-ties then flip)
    exact: bool = False


class Drafter:
    kind = ""
    needs_features = False  # True: drafts read Prefix.feats (the "last" target state)

    def feature_layers(self) -> frozenset:
        """The target hidden states (harness.models.lm tap keys) this drafter's drafts read."""
        return frozenset({lm.LAST}) if self.needs_features else frozenset()

    def __init__(self, name: str, settings: dict, env: DrafterEnv):
        self.name, self.settings, self.env = name, dict(settings), env
        self.stream = stream_id(name)

    def start(self, workload: str, prompt_id: str) -> None:
        pass

    def finish(self, output: list[int]) -> None:
        pass

    def draft(self, pre: Prefix, k: int) -> Draft:
        raise NotImplementedError

    def dense(self, seq: Sequence, done: dict) -> list[Draft]:
        """Drafts at every origin. Default: one `draft` call per position (the naive loop)."""
        return [self.draft(seq.prefix(p), k) for p, k in enumerate(seq.ks)]

    def info(self) -> dict:
        return {"settings": self.settings, "sha256": None}

    def _setting(self, key, default, cast=None):
        v = self.settings.setdefault(key, default)
        if v is None:
            raise HarnessError(f"--drafter {self.name}={self.kind}: missing setting {key}=")
        return cast(v) if cast else v

    def _check_settings(self, allowed: set[str]) -> None:
        bad = sorted(set(self.settings) - allowed)
        if bad:
            raise HarnessError(f"--drafter {self.name}={self.kind}: unknown setting(s) {bad}; known: {sorted(allowed)}")


def feature_layers(d) -> frozenset:
    """What a drafter (or a duck-typed one, by `needs_features`) reads of the target's states."""
    fn = getattr(d, "feature_layers", None)
    if callable(fn):
        return frozenset(fn())
    return frozenset({lm.LAST}) if getattr(d, "needs_features", False) else frozenset()


def count_entropy(counts) -> float:
    """The entropy (nats) of a distribution given by its counts."""
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log(c / n) for c in counts if c))
