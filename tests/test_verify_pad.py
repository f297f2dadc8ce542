"""Verification padding (harness.models.target, `pad`): a one-chain verify of Q tokens run as Q' gives the verdicts,
features and cache of the Q-token forward, the forward really has Q' rows, a live decode keeps its output, and a bad
table is one line."""

import pytest
import torch

from bench.early_stop import parse_pad
from bandit.logs.errors import UsageError
from harness.decode.engine import Engine, RunConfig
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.models import lm
from harness.models.lm import HarnessError
from harness.models.target import Target, check_pad
from harness.models.tiny import PROMPTS, make_zoo

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("pad"))
    z["model"], z["tok"] = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    return z


def _rows_seen(model):
    seen = []
    h = model.get_input_embeddings().register_forward_hook(lambda m, a, out: seen.append(int(a[0].numel())))
    return seen, h


@pytest.mark.parametrize("chain_len", [1, 2, 3])
def test_a_padded_verify_is_the_unpadded_one(zoo, chain_len):
    ids = zoo["tok"](PROMPTS[0][2]).input_ids
    results = []
    for pad in (None, {2: 6, 3: 6, 4: 7}):
        t = Target(zoo["model"], zoo["tok"], pad=pad)
        cache = lm.new_cache()
        lm.forward(zoo["model"], torch.tensor(ids[:-1]), cache, last_logits=True)
        chain = ids[:chain_len]  # any tokens: the verdicts are compared, not judged
        seen, h = _rows_seen(zoo["model"])
        verdicts, trunk_f, chain_f = t.verify(cache, ids[-1:], [chain], 0, 0)
        h.remove()
        k, v = cache.layers[0].keys, cache.layers[0].values
        results.append((verdicts[0], trunk_f, chain_f[0], lm.cache_len(cache), k.clone(), v.clone(), seen))
    (a, tf, cf, n, k, v, seen), (b, tf2, cf2, n2, k2, v2, seen2) = results
    q = 1 + chain_len
    assert seen == [q] and seen2 == [{2: 6, 3: 6, 4: 7}[q]]  # the padded forward ran Q' rows
    assert a.accepted == b.accepted and a.choices == b.choices
    assert a.p == pytest.approx(b.p, abs=1e-5)
    assert n == n2 == len(ids) - 1 + q  # the padding's cache entries are gone
    assert torch.allclose(k, k2, atol=1e-5) and torch.allclose(v, v2, atol=1e-5)
    assert torch.allclose(tf, tf2, atol=1e-5) and torch.allclose(cf, cf2, atol=1e-5)


def test_a_live_decode_keeps_its_output(zoo):
    spec = next(s for s in zoo["specs"] if s.startswith("eagle="))
    outs = []
    for pad in (None, {2: 5, 3: 5, 4: 5}):
        d = build_drafters([parse_spec(spec)], DrafterEnv(zoo["model"], zoo["tok"], zoo["target"]))
        eng = Engine(Target(zoo["model"], zoo["tok"], pad=pad), d, RunConfig("live", 3, 24, 0.0))
        outs.append([eng.run_prompt(w, p, zoo["tok"](t).input_ids).output for w, p, t in PROMPTS[:3]])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("bad", [{1: 2}, {3: 2}, {3: 3}, {"2": 3}, {2: True}, {2: 5000}])
def test_a_bad_table_is_one_line(bad):
    with pytest.raises(HarnessError, match="expected Q:Q'") as e:
        check_pad(bad)
    assert "\n" not in str(e.value)


def test_the_bench_option():
    assert parse_pad("2:3,4:5") == {2: 3, 4: 5} and parse_pad(None) == {}
    for bad in ("2", "a:b", "3:2"):
        with pytest.raises(UsageError, match="--pad"):
            parse_pad(bad)
