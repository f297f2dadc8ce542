"""layerskip: a self-speculative drafter that runs the target's own first L decoder layers, then the target's
final norm and lm_head (LayerSkip-style early exit, without the training).

The drafter is a second model object, built on the meta device from the target's config with
num_hidden_layers = L, whose every module is the target's own: the embeddings, the first L decoder layers
(a new ModuleList holding the same layer objects), the final norm, the rotary embedding and lm_head. No weight
is copied or allocated, and no module is changed: the target's forwards are untouched. The drafter keeps
its own KV cache (L layers deep) in sync with the prefix across blocks exactly as the small-LM drafter does
(DraftModelDrafter: keep the common prefix, crop the rest, feed the new tokens), and drafts densely the same
way (one teacher-forced pass, then chain-masked steps). The target's own cache is never read or written.

    --drafter ls2=layerskip:layers=2      1 <= layers < the target's decoder layers

Its greedy draft at a prefix equals, token by token, argmax(lm_head(norm(hidden_states[L]))) of a plain
forward of the full target over prefix + draft so far (hidden_states[0] is the embeddings; tests/test_layerskip.py).
"""

from __future__ import annotations

import copy
import hashlib

import torch

from ..models import lm
from ..models.lm import HarnessError
from .model import DraftModelDrafter, ModelDrafter


def early_exit_model(target, n_layers: int, where: str = "layerskip"):
    """A model of the target's class that runs its first `n_layers` decoder layers, then its final norm and
    output head: every module (and so every weight) shared with `target`, nothing copied."""
    layers = lm.decoder_layers(target)
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = n_layers
    if isinstance(getattr(cfg, "layer_types", None), list):  # per-layer attention kinds (Qwen2, Gemma)
        cfg.layer_types = cfg.layer_types[:n_layers]
    with torch.device("meta"):  # the skeleton's own parameters are never materialised: all are replaced
        model = type(target)(cfg)
    _share(model, target, layers, n_layers)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise HarnessError(
            f"{where}: {type(target).__name__}: cannot build the first {n_layers} layers from the target's modules "
            f"({len(left)} tensors not found in it, e.g. {left[0]})"
        )
    return model.eval()


def _share(dst, src, layers, n_layers: int) -> None:
    """Give `dst` the modules of `src` by name; the decoder layers' list becomes its first n_layers."""
    for name, child in src.named_children():
        if child is layers:
            setattr(dst, name, torch.nn.ModuleList(list(child)[:n_layers]))
        elif any(m is layers for m in child.modules()):
            _share(getattr(dst, name), child, layers, n_layers)
        else:
            setattr(dst, name, child)


class LayerSkipDrafter(DraftModelDrafter):
    """The target's first `layers=` decoder layers + its final norm and lm_head, greedy (or with the drafter's
    own noise stream at T > 0, as every model drafter), with its own KV cache over those layers."""

    kind = "layerskip"

    def __init__(self, name, settings, env):
        ModelDrafter.__init__(self, name, settings, env)  # no path, no model to load: the target's own layers
        where = f"--drafter {name}={self.kind}"
        n_layers = self._setting("layers", None)
        self.batch = self._setting("batch", 256, int)  # origins per dense pass
        self._check_settings({"layers", "batch", "stop_below"})
        self.stop_below = self._read_stop()
        if env.target is None:
            raise HarnessError(f"{where}: needs the loaded target model (none was given to the drafters)")
        n = int(getattr(env.target.config, "num_hidden_layers", 0) or 0)
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers < n:
            allowed = f"an integer in 1..{n - 1}" if n > 1 else "none (a 1-layer target has nothing to skip)"
            raise HarnessError(
                f"{where}: setting layers={n_layers!r}: expected {allowed} (the target has {n} decoder layers)"
            )
        self.n_layers = n_layers
        self.model = early_exit_model(env.target, n_layers, where)
        self.cache, self.cache_ids = None, []

    def info(self):
        """sha256 over the kind, the layer count and the target's weights (lm.weights_sha256 of its directory);
        None when the target came from no directory."""
        path = self.env.target_path
        if path is None:
            return {"settings": self.settings, "sha256": None}
        text = f"{self.kind}:layers={self.n_layers}:{lm.weights_sha256(path)}"
        return {"settings": self.settings, "sha256": hashlib.sha256(text.encode()).hexdigest()}
