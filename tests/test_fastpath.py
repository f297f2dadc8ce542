"""harness/models/fastpath.py: the lean forward gives bitwise the logits, hidden states and cache of transformers'
own forward on every form the harness runs (a prefill, one token after a cache, a causal verify of Q tokens, a tree
mask, taps), at float32 and bfloat16, on plain and prepacked linears (where it also fuses q/k/v and gate/up); the
growing cache holds bitwise what DynamicCache holds through crops, moves and batch selection; anything else goes
to transformers' forward."""

import pytest
import torch
import transformers as tf
from transformers import DynamicCache

from harness.models import fastpath, kernels, lm

from test_kernels import MKLDNN, tiny_llama

PATHS = ["aten"] + (["mkldnn"] if MKLDNN else [])
BF16 = MKLDNN and kernels.unavailable("mkldnn", torch.bfloat16) is None
IDS = torch.randint(0, 97, (60,), generator=torch.Generator().manual_seed(3))


def pair(path: str, dtype=torch.float32, tied: bool = False):
    """(reference, lean): the same seeded model twice, on `path`; the reference runs transformers' forward."""
    ref, lean = tiny_llama(tied=tied, hidden=64, layers=3), tiny_llama(tied=tied, hidden=64, layers=3)
    kernels.apply_kernels(ref, path, dtype)
    kernels.apply_kernels(lean, path, dtype)
    fastpath.uninstall(ref)
    assert fastpath.install(lean) and fastpath.installed(lean) and not fastpath.installed(ref)
    return ref, lean


def kv(cache) -> list[torch.Tensor]:
    return [t for k, v in lm._kv_pairs(cache) for t in (k, v)]


def same(a, b) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), f"max difference {(a.float() - b.float()).abs().max().item()}"


def forms():
    """(name, prefix length, call(model, cache) -> (logits, feats)) for each form of lm.forward the harness uses."""
    q5 = IDS[40:45]
    tree = torch.ones(5, 45, dtype=torch.bool).tril(40)  # two chains after 40 positions: 0-1-2 and 3-4
    tree[3:, 40:43] = False
    return [
        ("prefill", 0, lambda m, c: lm.forward(m, IDS[:40], c)),
        ("prefill, last logits", 0, lambda m, c: lm.forward(m, IDS[:40], c, last_logits=True)),
        ("one token", 40, lambda m, c: lm.forward(m, IDS[40:41], c)),
        *[(f"verify {q}", 40, lambda m, c, q=q: lm.forward(m, IDS[40 : 40 + q], c, causal=True)) for q in (2, 5, 9)],
        ("tree", 40, lambda m, c: lm.forward(m, q5, c, allow=tree, pos=torch.tensor([40, 41, 42, 40, 41]))),
        ("taps", 40, lambda m, c: lm.forward(m, q5, c, causal=True, taps=["in:0", "in:2", "out:1", "out:2", "last"])),
        ("taps at prefill", 0, lambda m, c: lm.forward(m, IDS[:30], c, causal=True, taps=["in:1", "last"])),
        ("hidden", 40, lambda m, c: lm.forward(m, IDS[40:41], c, hidden=True)),
        ("no mask after a cache", 40, lambda m, c: lm.forward(m, q5, c)),  # (transformers' forward: fallback)
    ]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if BF16 else []), ids=str)
@pytest.mark.parametrize("form", forms(), ids=lambda f: f[0])
def test_lean_forward_is_bitwise_transformers(path, dtype, form, monkeypatch):
    name, n0, call = form
    ref, lean = pair(path, dtype)
    layers = []  # the decoder layers the lean forward ran itself (none where it hands over to transformers')
    monkeypatch.setattr(fastpath, "_layer", lambda *a, f=fastpath._layer: layers.append(1) or f(*a))
    caches = {"ref": DynamicCache(), "lean": lm.new_cache()}
    outs = {}
    for who, m in (("ref", ref), ("lean", lean)):
        c = caches[who]
        if n0:
            lm.forward(m, IDS[:n0], c)
        layers.clear()
        outs[who] = call(m, c)
    assert len(layers) == (0 if name == "no mask after a cache" else 3)
    same(outs["ref"][0], outs["lean"][0])
    fr, fl = outs["ref"][1], outs["lean"][1]
    if isinstance(fr, dict):
        assert fr.keys() == fl.keys()
        for k in fr:
            same(fr[k], fl[k])
    elif fr is not None:
        same(fr, fl)
    for a, b in zip(kv(caches["ref"]), kv(caches["lean"]), strict=True):
        same(a, b)


@pytest.mark.skipif(not MKLDNN, reason="no oneDNN on this host")
def test_prepacked_layers_are_fused_and_refused_after_a_weight_changes():
    ref, lean = pair("mkldnn")
    c0, c1 = DynamicCache(), lm.new_cache()
    same(lm.forward(ref, IDS[:20], c0)[0], lm.forward(lean, IDS[:20], c1)[0])
    attn, mlp = lean.model.layers[0].self_attn, lean.model.layers[0].mlp
    assert "_specbandit_fused" in attn.__dict__ and "_specbandit_fused" in mlp.__dict__
    assert attn.q_proj._packed is None  # the component's own packed copy dropped while fused
    with torch.no_grad():  # a weight written in place: the fused pack is made again from the new weights
        for m in (ref, lean):
            m.model.layers[0].mlp.up_proj.weight.mul_(0.5)
    c0, c1 = DynamicCache(), lm.new_cache()
    same(lm.forward(ref, IDS[:20], c0)[0], lm.forward(lean, IDS[:20], c1)[0])


def test_a_generation_is_the_same_token_for_token():
    """Greedy decoding through the harness's own Target.generate (with its features), lean against transformers'
    forward."""
    from harness.models.target import Target
    from harness.models.tiny import make_tokenizer

    ref, lean = pair(PATHS[-1])
    (y0, f0, _), (y1, f1, _) = (Target(m, make_tokenizer()).generate(IDS[:12].tolist(), 30, 0) for m in (ref, lean))
    assert y0 == y1 and len(y0) > 1
    same(torch.as_tensor(f0), torch.as_tensor(f1))


def test_the_growing_cache_holds_what_dynamic_cache_holds():
    """Updates, crops (to the middle and to nothing), a span moved after a tree verify, appended copies and a
    batch selection, applied to both caches: the same tensors every time; the buffer is written in place while it
    has room."""
    g = torch.Generator().manual_seed(0)
    a, b = DynamicCache(), lm.new_cache()

    def step(q: int, batch: int = 2):
        k, v = torch.randn(batch, 2, q, 8, generator=g), torch.randn(batch, 2, q, 8, generator=g)
        for c in (a, b):
            c.update(k, v, 0)
            c.update(k + 1, v - 1, 1)

    with torch.inference_mode():
        step(10)
        buf = b.layers[0]._kb
        step(3)
        assert b.layers[0]._kb is buf  # room left: written in place
        for c in (a, b):
            lm.crop(c, 7)
        step(4)
        for c in (a, b):
            lm.move_span(c, 7, 9, 2)
        step(300)  # past the buffer's room: a bigger one
        assert b.layers[0]._kb is not buf
        tail = lm.kv_tail(a, 100)
        for c in (a, b):
            lm.crop(c, 100)
            lm.kv_extend(c, tail)
            c.batch_select_indices(torch.tensor([1]))
        step(2, batch=1)
        for c in (a, b):
            lm.crop(c, 0)
        step(5, batch=1)
    assert a.get_seq_length() == b.get_seq_length() == 5
    for x, y in zip(kv(a), kv(b), strict=True):
        same(x, y)


def test_outside_inference_mode_and_under_autograd_the_cache_still_works():
    b, a = lm.new_cache(), DynamicCache()
    with torch.inference_mode():
        k = torch.randn(1, 2, 4, 8)
        b.update(k, k, 0)
        a.update(k, k, 0)
    with torch.no_grad():  # an inference-mode buffer cannot be written here: a new one is made
        k2 = torch.randn(1, 2, 1, 8)
        b.update(k2, k2, 0)
        a.update(k2, k2, 0)
    same(a.layers[0].keys, b.layers[0].keys)
    w = torch.randn(1, 2, 2, 8, requires_grad=True)
    keys, _ = b.update(w * 2, w, 0)
    keys.sum().backward()  # the autograd path concatenates, as DynamicLayer does
    assert torch.equal(w.grad, torch.full_like(w, 2.0))


def test_what_the_lean_forward_does_not_take_goes_to_transformers():
    ref, lean = pair("aten")
    x = IDS[None, :12]
    with torch.no_grad():  # no cache, no positions, a 2D padding mask, labels: transformers' forward, the same result
        same(ref(input_ids=x).logits, lean(input_ids=x).logits)
        mask = torch.ones_like(x)
        same(ref(input_ids=x, attention_mask=mask).logits, lean(input_ids=x, attention_mask=mask).logits)
        assert lean(input_ids=x, labels=x).loss is not None


def test_unsupported_models_keep_their_forward_and_say_why():
    qwen = tf.Qwen2ForCausalLM(
        tf.Qwen2Config(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )  # fmt: skip
    )
    assert "Qwen2ForCausalLM" in fastpath.unsupported(qwen)
    assert not fastpath.install(qwen) and not fastpath.installed(qwen)
    m = tiny_llama()
    m.config.mlp_bias = True
    assert "bias" in fastpath.unsupported(m)
    m = tiny_llama()
    kernels.apply_kernels(m, "mkldnn" if MKLDNN else "aten")
    assert kernels.describe(m)["forward"] == ("lean" if MKLDNN else "transformers")
    kernels.apply_kernels(m, "aten")  # plain transformers again
    assert not fastpath.installed(m) and kernels.describe(m)["forward"] == "transformers"


def test_a_copy_of_the_model_runs_its_own_weights():
    import copy

    _, lean = pair("aten")
    twin = copy.deepcopy(lean)
    assert fastpath.installed(twin) and twin.forward.__self__ is twin
    with torch.no_grad():
        twin.lm_head.weight.mul_(2.0)
    a, _ = lm.forward(lean, IDS[:8], lm.new_cache())
    b, _ = lm.forward(twin, IDS[:8], lm.new_cache())
    same(a * 2.0, b)
