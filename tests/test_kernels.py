"""harness/models/kernels.py: every kernel path computes the target's function (logits within tolerance of aten,
the same greedy tokens at float32), the swap is in place and idempotent, a tied lm_head stays the embedding's own
Parameter, and what cannot run is said (an unknown name refused; an unavailable path falls back with its reason)."""

import warnings

import pytest
import torch
import transformers as tf
from transformers import DynamicCache

from harness.models import fastpath
from harness.models import kernels as K

MKLDNN = K.unavailable("mkldnn", torch.float32) is None
needs_mkldnn = pytest.mark.skipif(not MKLDNN, reason="no oneDNN on this host")


def tiny_llama(tied: bool = False, seed: int = 0, hidden: int = 64, layers: int = 2) -> tf.LlamaForCausalLM:
    """A seeded random Llama whose weights are scaled up so that its greedy choices are decisive (planted margins:
    a kernel that changes the function changes tokens, one that rounds differently does not)."""
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(
        vocab_size=97,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        cache = DynamicCache()
        K.cached_forward(model, ids[:, :-5], cache)
        return K.cached_forward(model, ids[:, -5:], cache).logits.float()  # a 5-token pass after a cache


def greedy(model, prompt: list[int], n: int) -> list[int]:
    out, cache = [], DynamicCache()
    with torch.inference_mode():
        lg = K.cached_forward(model, torch.tensor([prompt]), cache).logits[0, -1]
        for _ in range(n):
            out.append(int(lg.argmax()))
            lg = K.cached_forward(model, torch.tensor([[out[-1]]]), cache).logits[0, -1]
    return out


IDS = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(1))


@needs_mkldnn
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_mkldnn_logits_match_aten(dtype, tol, monkeypatch):
    if K.unavailable("mkldnn", dtype):
        pytest.skip(K.unavailable("mkldnn", dtype))
    model = K.apply_kernels(tiny_llama(), "aten", dtype)
    ref = logits(model, IDS)
    calls = []
    real = K.mkldnn_linear
    monkeypatch.setattr(K, "mkldnn_linear", lambda *a: calls.append(1) or real(*a))
    K.apply_kernels(model, "mkldnn", dtype)
    fastpath.uninstall(model)  # transformers' forward: each linear once (the lean one fuses some: test_fastpath.py)
    calls.clear()  # (the availability check ran one small linear)
    got = logits(model, IDS)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert len(calls) == 2 * n_linear  # every linear of both forwards went through oneDNN, none silently aten
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= tol * max(1.0, scale)
    assert got.dtype == torch.float32 and next(model.parameters()).dtype == dtype


@needs_mkldnn
@pytest.mark.parametrize("tied", [False, True])
def test_float32_greedy_is_identical_to_aten(tied):
    model = tiny_llama(tied=tied, seed=4)
    prompt = IDS[0, :12].tolist()
    ref = greedy(K.apply_kernels(model, "aten", torch.float32), prompt, 40)
    assert tied or len(set(ref)) > 8  # a planted model that says something, not one token forever
    assert greedy(K.apply_kernels(model, "mkldnn", torch.float32), prompt, 40) == ref


@needs_mkldnn
def test_swap_is_in_place_idempotent_and_undone_by_aten():
    model = tiny_llama()
    keys = list(model.state_dict())
    lin = model.model.layers[0].self_attn.q_proj
    K.apply_kernels(model, "mkldnn", torch.float32)
    assert model.model.layers[0].self_attn.q_proj is lin and type(lin) is K.PackedLinear
    assert lin._packed is not None
    first = logits(model, IDS)
    packed = lin._packed
    K.apply_kernels(model, "mkldnn", torch.float32)  # again: nothing repacked, nothing wrapped twice
    assert lin._packed is packed and type(lin) is K.PackedLinear
    assert torch.equal(logits(model, IDS), first)
    assert list(model.state_dict()) == keys  # the packed copies are no state: checkpoints unchanged
    K.apply_kernels(model, "aten", torch.float32)
    assert all(type(m) is not K.PackedLinear for m in model.modules()) and "_packed" not in vars(lin)
    assert K.describe(model)["kernels"] == "aten"


@needs_mkldnn
def test_tied_lm_head_stays_the_embedding_and_follows_its_changes():
    model = tiny_llama(tied=True)
    emb = model.model.embed_tokens.weight
    K.apply_kernels(model, "mkldnn", torch.float32)
    assert model.lm_head.weight is emb and type(model.model.embed_tokens) is torch.nn.Embedding
    with torch.no_grad():
        emb.mul_(0.5)  # an in-place write (a load, a shared update): the packed copy must not go stale
    got = logits(model, IDS)
    ref = logits(K.apply_kernels(model, "aten", torch.float32), IDS)
    assert (got - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


@needs_mkldnn
def test_modules_held_by_reference_are_packed_too():
    """EagleHead keeps the target's lm_head as a plain attribute, outside its module tree."""
    from harness.models.heads import EagleHead

    target = tiny_llama()
    head = EagleHead.from_target(target)
    K.apply_kernels(head, "mkldnn", torch.float32)
    assert type(head.fc) is K.PackedLinear and type(target.lm_head) is K.PackedLinear

    class Holder:  # a drafter holds its networks as attributes
        def __init__(self):
            self.head = head

    K.apply_drafter(Holder(), "aten", torch.float32)
    assert type(head.fc) is torch.nn.Linear and type(target.lm_head) is torch.nn.Linear


def test_autograd_takes_the_plain_path():
    """oneDNN's op has no backward: a forward that records autograd runs aten and still trains."""
    lin = torch.nn.Linear(8, 4)
    holder = torch.nn.Sequential(lin)
    K.apply_kernels(holder, "mkldnn" if MKLDNN else "aten", torch.float32)
    lin(torch.randn(3, 8)).sum().backward()
    assert lin.weight.grad is not None


def test_unknown_names_are_refused():
    model = tiny_llama(layers=1)
    with pytest.raises(ValueError, match="unknown kernel path 'mkl'.*aten, mkldnn, compile"):
        K.apply_kernels(model, "mkl", torch.float32)
    with pytest.raises(ValueError, match="dtype 'float16' is not one of float32, bfloat16"):
        K.apply_kernels(model, "aten", "float16")
    with pytest.raises(ValueError, match="unknown kernel path"):
        K.probe(model, paths=("aten", "fast"))


def test_an_unavailable_path_falls_back_with_its_reason(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = tiny_llama(layers=1)
    with pytest.warns(UserWarning, match="unavailable.*no oneDNN"):
        K.apply_kernels(model, "mkldnn", torch.float32)
    d = K.describe(model)
    assert d["kernels"] == "aten" and d["requested"] == "mkldnn" and "is_available() is False" in d["fallback"]
    assert all(type(m) is not K.PackedLinear for m in model.modules())
    with pytest.raises(ValueError, match="no oneDNN"):
        K.apply_kernels(model, "mkldnn", torch.float32, strict=True)


def test_probe_times_each_path_and_keeps_the_best():
    model = tiny_llama(layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the probe itself warns about nothing
        got = K.probe(model, torch.float32, context=16, reps=1)
    assert set(got["figures"]) == ({"aten", "mkldnn"} if MKLDNN else {"aten"})
    assert all(set(f) == {"1", "5"} and min(f.values()) > 0 for f in got["figures"].values())
    assert got["best"] in got["figures"] and got["threads"] == torch.get_num_threads()
    d = K.describe(model)
    assert d["kernels"] == got["best"] and d["probe"] == got and d["dtype"] == "float32"
