"""Drafters behind one small protocol, one family per module, and how the CLI names them.

base.py         the protocol (Draft, Prefix, Sequence, DrafterEnv, Drafter; its documentation), STEP_KEYS, shared helpers
registry.py     BUILTIN (kind -> "module:Class"), --drafter specs, the plug-in entry points, build_drafters
lookup.py       ngram: prompt lookup over prompt + output
suffix.py       suffix: SuffixDecoding-style lookup (rule=longest, or arctic's trees, suffix_tree.py)
suffix_tree.py  arctic-inference's suffix trie and per-request cache, for suffix:rule=arctic
model.py        ModelDrafter (what every network drafter shares) and draft: an independent small causal LM
heads.py        medusa and eagle: heads on the target's last state (the head models: harness/models/heads.py)
eagle3.py       eagle3: EAGLE-3 on three target layers (the model: harness/models/eagle3.py)
dflash.py       dflash: DFlash block diffusion on target layer outputs (the model: harness/models/dflash.py)
layerskip.py    layerskip: self-speculative, the target's own first L layers, its final norm and lm_head
cascade.py      cascade: a composition of drafters named before it

A new kind is a module here and one line in registry.BUILTIN (registry.py's docstring says how).
"""

from .base import Draft, Drafter, DrafterEnv, Prefix, Sequence, common_prefix, feature_layers
from .lookup import NgramDrafter
from .registry import DrafterSpec, build_drafters, parse_settings, parse_spec
from .suffix import SuffixDrafter

__all__ = [
    "Draft",
    "Drafter",
    "DrafterEnv",
    "DrafterSpec",
    "NgramDrafter",
    "Prefix",
    "Sequence",
    "SuffixDrafter",
    "build_drafters",
    "common_prefix",
    "feature_layers",
    "parse_settings",
    "parse_spec",
]
