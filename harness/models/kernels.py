"""Which kernels a model's linears run on: plain aten, prepacked oneDNN (mkldnn) weights, or torch.compile (issue 32).

On CPU every float32 `nn.Linear` goes through `aten::mm` to MKL's SGEMM, whose time jumps for row counts M two or
three above a multiple of 4 (the lm_head of SmolLM2 took 2-3x longer at M = 2, 3 than at M = 1): a verify forward of
a few tokens then costs much more than one of a single token, which no production engine charges. The same weights
reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`) and multiplied by
`torch.ops.mkldnn._linear_pointwise` (the op inductor itself emits for frozen linears) are flat over M = 1..8 and
give the same argmax; nothing here is a hand-written kernel.

    apply_kernels(model, "mkldnn", torch.float32)   # every nn.Linear in `model` on prepacked weights
    apply_kernels(model, "aten", torch.float32)     # back to plain aten (the packed copies dropped)
    apply_drafter(drafter, kernels, dtype)          # the same for each nn.Module a drafter holds
    probe(model, dtype) -> {"figures": ..., "best": ...}  # time Q = 1 and Q = 5 on each path, keep the best
    describe(model) -> {"dtype", "kernels", "threads", "probe", ...}    # for the manifest

The swap changes each `nn.Linear`'s class in place (to `PackedLinear`, a subclass): the module object, its weight
Parameter and its place in the tree stay the same, so a tied lm_head stays the embedding's own Parameter, and a
module that another holds by reference (EagleHead's `_lm_head`, layerskip's shared layers) runs packed too whichever
was built first. The packed copy is made again when the weight changes (another tensor, another dtype, an in-place
write bumps its version), and the plain path runs when autograd is recording (the oneDNN op has no backward) or the
input is of another dtype or device.
"""

from __future__ import annotations

import inspect
import shutil
import statistics
import time
import warnings
import weakref

import torch
from torch import nn

from . import fastpath
from .options import KERNEL_CHOICES

KERNELS = ("aten", "mkldnn", "compile")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_STATE: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()  # model -> what apply did


def resolve_dtype(dtype) -> torch.dtype:
    """A torch dtype from a dtype or its name; only float32 and bfloat16 (the two the harness measures)."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    if dtype in DTYPES.values():
        return dtype
    raise ValueError(f"kernels: dtype {dtype!r} is not one of {', '.join(DTYPES)}")


def check_kernels(kernels: str) -> str:
    if kernels not in KERNELS:
        raise ValueError(f"kernels: unknown kernel path {kernels!r}; known: {', '.join(KERNELS)}")
    return kernels


def unavailable(kernels: str, dtype=torch.float32) -> str | None:
    """Why `kernels` cannot run here at `dtype`, or None when it can (checked by running it on a small linear)."""
    check_kernels(kernels)
    dtype = resolve_dtype(dtype)
    if kernels == "aten":
        return None
    if kernels == "compile":
        if shutil.which("g++") is None and shutil.which("c++") is None:
            return "torch.compile needs a C++ compiler (none on PATH)"
        return None
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight") or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return f"torch {torch.__version__} lacks mkldnn._reorder_linear_weight / _linear_pointwise"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bfloat16 support in oneDNN (no avx512_bf16/amx/avx512 core)"
    try:  # a build or CPU where the op exists but fails: refused here, not in the middle of a run
        w = torch.randn(8, 4).to(dtype)
        got = mkldnn_linear(torch.randn(3, 4).to(dtype), torch.ops.mkldnn._reorder_linear_weight(w, None), None)
        if got.shape != (3, 8):
            return f"mkldnn linear returned shape {tuple(got.shape)} for (3, 8)"
    except RuntimeError as e:
        return f"mkldnn linear failed: {str(e).splitlines()[0]}"
    return None


def mkldnn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Linear):
    """An nn.Linear whose forward multiplies by a oneDNN-reordered copy of its weight. Never constructed: `pack`
    turns an existing nn.Linear into one in place (so every reference to the module sees it)."""

    _packed: torch.Tensor | None = None
    _key: tuple | None = None

    def _weight_key(self) -> tuple:
        w = self.weight
        try:
            version = w._version
        except RuntimeError:  # a weight made under inference_mode keeps no version counter (and is not trained)
            version = -1
        return (w.data_ptr(), w.dtype, version, tuple(w.shape))

    def repack(self) -> None:
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._key = self._weight_key()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            x.dtype != w.dtype
            or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))  # no backward through oneDNN
        ):
            return nn.functional.linear(x, w, self.bias)
        if self._key != self._weight_key():  # loaded, cast, shared or written in place since packing
            self.repack()
        return mkldnn_linear(x, self._packed, self.bias)


def fused(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor | None:
    """x through the linears `names` of `owner` as one oneDNN product over their stacked weights (packed once, again
    when a weight changes), the outputs side by side; None unless all are on prepacked oneDNN weights
    (PackedLinear) without biases and x is of their dtype. Each output column is the same
    dot product over the same packed row either way, so the numbers are those of the separate products (checked by
    tests/test_fastpath.py). The lean forward's `fuse` (harness.models.fastpath)."""
    mods = [getattr(owner, n) for n in names]
    if any(type(m) is not PackedLinear or m.bias is not None or m.weight.dtype != x.dtype for m in mods):
        return None
    key = tuple(m._weight_key() for m in mods)
    held = owner.__dict__.get("_specbandit_fused")
    if held is None or held[0] != key:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(torch.cat([m.weight.detach() for m in mods]), None)
        held = owner.__dict__["_specbandit_fused"] = (key, packed)
        for m in mods:  # their own packed copies are not read while fused (a fallback forward packs them again)
            m._packed, m._key = None, None
    return mkldnn_linear(x, held[1], None)


def _linears(model: nn.Module):
    """Every nn.Linear (or PackedLinear) in `model`, also those it holds outside its module tree (EagleHead keeps
    the target's lm_head by a plain attribute), each once."""
    seen: set[int] = set()
    stack = list(model.modules())
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if type(m) in (nn.Linear, PackedLinear):
            yield m
        stack.extend(v for v in vars(m).values() if isinstance(v, nn.Module) and id(v) not in seen)
        stack.extend(c for c in m.children() if id(c) not in seen)


def _pack(m: nn.Linear) -> None:
    if type(m) is not PackedLinear:
        m.__class__ = PackedLinear
    if m._key != m._weight_key():
        m.repack()


def _unpack(m: nn.Linear) -> None:
    if type(m) is PackedLinear:
        m.__dict__.pop("_packed", None)
        m.__dict__.pop("_key", None)
        m.__class__ = nn.Linear


def _uncompile(model: nn.Module) -> None:
    if "forward" in model.__dict__ and getattr(model.forward, "_specbandit_compiled", False):
        del model.forward  # the class's own forward again


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers to `dtype` (a no-op when they are; integer buffers kept)."""
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model.to(dtype)


def apply_kernels(model: nn.Module, kernels: str, dtype=torch.float32, strict: bool = False) -> nn.Module:
    """Run every nn.Linear of `model` on the `kernels` path at `dtype` (the model is cast first if it is not);
    returns `model` itself, changed in place. Idempotent: applying the same path twice changes nothing, applying
    another undoes the first. A path this host cannot run falls back to "aten" with the reason in `describe`
    and a warning (strict=True: raised as ValueError). "compile" wraps the model's forward in torch.compile with
    inductor's freezing (which itself picks the packed oneDNN or MKL linears per dtype); its first calls at new
    shapes compile (one to several minutes for SmolLM2 on 2 cores), and forward hooks added later (taps) recompile, so the harness's tapped
    forwards want "mkldnn"."""
    check_kernels(kernels)
    dtype = resolve_dtype(dtype)
    _cast(model, dtype)
    why = unavailable(kernels, dtype)
    devices = {p.device.type for p in model.parameters()}
    if kernels != "aten" and devices - {"cpu"}:  # oneDNN's reorder and inductor's CPU freezing are for the CPU
        why = f"the model is on {', '.join(sorted(devices - {'cpu'}))}, these kernels are the CPU's"
    state = {"kernels": kernels, "dtype": str(dtype).removeprefix("torch."), "requested": kernels}
    if why:
        if strict:
            raise ValueError(f"kernels {kernels!r} at {state['dtype']}: {why}")
        warnings.warn(f"kernels {kernels!r} unavailable ({why}); running on aten", stacklevel=2)
        state.update(kernels="aten", fallback=why)
    kernels = state["kernels"]
    _uncompile(model)
    fastpath.uninstall(model)
    for m in _linears(model):
        (_pack if kernels == "mkldnn" else _unpack)(m)
    if kernels == "mkldnn":  # the lean forward over the same modules (bitwise the same logits; fastpath.py)
        fastpath.install(model, fuse=fused)
    if kernels == "compile":
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # weights as constants: lets inductor prepack every linear
        compiled = torch.compile(type(model).forward.__get__(model), dynamic=True)
        compiled._specbandit_compiled = True
        model.forward = compiled
    state["probe"] = _STATE.get(model, {}).get("probe")
    _STATE[model] = state
    return model


def drafter_modules(drafter) -> list[nn.Module]:
    """The nn.Modules a drafter object holds as attributes (a head, a draft model, an early-exit model)."""
    return [v for v in vars(drafter).values() if isinstance(v, nn.Module)]


def apply_drafter(drafter, kernels: str, dtype=torch.float32, strict: bool = False):
    """`apply_kernels` on every nn.Module the drafter holds. Pass the target's dtype: a drafter's tree may hold the
    target's own modules (layerskip's layers), which another dtype would cast too. Returns the drafter."""
    for m in drafter_modules(drafter):
        apply_kernels(m, kernels, dtype, strict)
    return drafter


def describe(model: nn.Module | None = None) -> dict:
    """What ran, for a manifest: {dtype, kernels, threads, probe} (+ requested, fallback when a path fell back)."""
    out = {"threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available()}
    if model is not None:  # whose forward ran: the lean one (harness.models.fastpath) or transformers' own
        out["forward"] = "lean" if fastpath.installed(model) else "transformers"
    state = _STATE.get(model) if model is not None else None
    if state is None:
        dt = next((p.dtype for p in model.parameters()), None) if model is not None else None
        return {
            "dtype": None if dt is None else str(dt).removeprefix("torch."),
            "kernels": "aten",
            "probe": None,
            **out,
        }
    return {**state, **out}


def cache_kw(model) -> str:
    """The name the model's forward takes its KV cache by (transformers 5.x renamed past_key_values to cache)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def cached_forward(model, ids: torch.Tensor, cache):
    """One forward of ids (1, Q) after the cache (extended in place): the shape of a verify pass (causal mask)."""
    n0 = cache.get_seq_length()
    pos = torch.arange(n0, n0 + ids.shape[1])[None]
    return model(input_ids=ids, position_ids=pos, use_cache=True, **{cache_kw(model): cache})


def crop(cache, keep: int) -> None:
    """Keep the cache's first `keep` positions (transformers 5.x crops by a negative count to remove)."""
    n = cache.get_seq_length()
    if keep < n:
        cache.crop(keep - n)


def _timed_forward(model, ids: torch.Tensor, cache) -> float:
    from . import lm

    t0 = time.perf_counter()
    lm.forward(model, ids[0], cache, causal=True)  # a verify pass as the harness runs it
    return 1000 * (time.perf_counter() - t0)


def probe(
    model: nn.Module,
    dtype=torch.float32,
    paths: tuple[str, ...] = ("aten", "mkldnn"),
    context: int = 300,
    qs: tuple[int, ...] = (1, 5),
    reps: int = 5,
    seed: int = 0,
) -> dict:
    """Time a cached forward of each Q in `qs` after `context` positions (median of `reps`) on each path this host
    can run, and leave `model` on the best: the least summed median over `qs`, ties to the earlier path. "compile"
    is not probed by default (its compiles take longer than the probe). Returns {"figures": {path: {Q: ms}},
    "best", "dtype", "threads", "context", "reps", "skipped": {path: reason}}, also kept for `describe`."""
    from . import lm

    for p in paths:
        check_kernels(p)
    dtype = resolve_dtype(dtype)
    n_pos = int(getattr(model.config, "max_position_embeddings", context + max(qs)) or 0)
    context = max(1, min(context, n_pos - max(qs)))
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (1, context), generator=g)
    figures, skipped = {}, {}
    for p in paths:
        why = unavailable(p, dtype)
        if why:
            skipped[p] = why
            continue
        apply_kernels(model, p, dtype)
        cache = lm.new_cache()
        with torch.inference_mode():
            lm.forward(model, prompt[0], cache)
            figures[p] = {}
            for q in qs:
                ids = torch.randint(0, vocab, (1, q), generator=g)
                times = []
                for r in range(reps + 1):  # the first unmeasured: first-call allocations (and compiles)
                    t = _timed_forward(model, ids, cache)
                    crop(cache, context)
                    if r:
                        times.append(t)
                figures[p][q] = round(statistics.median(times), 3)
    best = min(figures, key=lambda p: (sum(figures[p].values()), list(figures).index(p))) if figures else "aten"
    result = {
        "figures": {p: {str(q): v for q, v in f.items()} for p, f in figures.items()},
        "best": best,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "context": context,
        "reps": reps,
        "skipped": skipped,
    }
    apply_kernels(model, best, dtype)
    _STATE[model]["probe"] = result
    return result


CHOICES = KERNEL_CHOICES  # the sweep's --kernels, checked torch-free in options.py


def choose(model: nn.Module, requested: str, device: str) -> dict:
    """Put the target on the path a run asked for and return `describe`'s record for its manifest. "default":
    prepacked oneDNN on a CPU that has it (flat in the verify length, the same greedy argmax at float32 as aten:
    tests/test_kernels.py), else aten; "auto": the faster of the two by a short probe at start-up; or a path by
    name. A GPU, or a dtype this module does not measure (float16), keeps aten."""
    if requested not in CHOICES:
        raise ValueError(f"--kernels {requested!r}: expected one of {', '.join(CHOICES)}")
    dtype = next(model.parameters()).dtype
    if not device.startswith("cpu") or dtype not in DTYPES.values():
        return {**describe(model), "requested": requested}
    if requested == "auto":
        probe(model, dtype, reps=3)
    else:
        path = requested if requested != "default" else "mkldnn" if unavailable("mkldnn", dtype) is None else "aten"
        apply_kernels(model, path, dtype)
    return {**describe(model), "requested": requested}
