"""stop_below on the chain drafters (draft, layerskip, eagle, eagle3): a dense draft is the unstopped chain cut
after its first token of confidence below the threshold (recomputed here from the unstopped records), a live run
with the rule walks the same trajectory with the same drafts, a live call runs one head step per drafted token, and
a bad value is one line naming the drafter."""

import pytest
import torch

from harness.decode.engine import Engine, RunConfig
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.models import eagle3, lm
from harness.models.lm import HarnessError
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_zoo

torch.set_num_threads(1)
MAX_NEW, K = 30, 5
CHAIN = ("draft", "layerskip", "eagle", "e3")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop")
    z = make_zoo(root, "llama")
    z["model"], z["tok"] = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    e3 = eagle3.write_random(root / "e3", z["model"], [0, 1, 2], draft_vocab=60, seed=5)
    z["base"] = {
        "draft": f"draft=draft:path={z['draft']}",
        "layerskip": "layerskip=layerskip:layers=1",
        "eagle": f"eagle=eagle:path={root / 'eagle'}",
        "e3": f"e3=eagle3:path={e3}",
    }
    return z


def _with(spec: str, key: str, value) -> str:
    return spec + (f",{key}={value}" if ":" in spec else f":{key}={value}")


def _specs(z, tau=None):
    """The chain drafters' specs; tau: one threshold for all, or {drafter: threshold}."""
    at = (lambda n: tau[n]) if isinstance(tau, dict) else (lambda n: tau)
    return [z["base"][n] if tau is None else _with(z["base"][n], "stop_below", at(n)) for n in CHAIN]


def _drafters(z, tau=None):
    env = DrafterEnv(z["model"], z["tok"], z["target"])
    return build_drafters([parse_spec(s) for s in _specs(z, tau)], env)


def _prompts(z, n=4):
    return [(w, p, z["tok"](t).input_ids) for w, p, t in PROMPTS[:n]]


def _dense(z, tau=None):
    eng = Engine(Target(z["model"], z["tok"]), _drafters(z, tau), RunConfig("dense", K, MAX_NEW, 0.0))
    return [eng.run_prompt(*p) for p in _prompts(z)]


@pytest.fixture(scope="module")
def full(zoo):
    return _dense(zoo)


@pytest.fixture(scope="module")
def tau(full):
    """Per drafter, a threshold at the median of its recorded confidences (so it cuts many drafts), moved into a gap
    of them (none within 2e-5: dense and live forwards differ by float noise far below that, so no stop moves)."""
    out = {}
    for n in CHAIN:
        confs = sorted(c for res in full for r in res.records for c in r["drafts"][n]["conf"])
        mid = confs[len(confs) // 2]
        out[n] = next(
            (
                round(c, 7)
                for i in range(1, 10_000)
                for c in (mid + i * 1e-6, mid - i * 1e-6)
                if all(abs(x - round(c, 7)) > 2e-5 for x in confs)
            ),
            None,
        )
        if out[n] is None:
            pytest.skip(f"{n}: no gap in the recorded confidences")
    return out


def _cut(d: dict, tau: float) -> list[int]:
    """The rule, by hand: up to and including the first token of confidence below tau."""
    n = next((i + 1 for i, c in enumerate(d["conf"]) if c < tau), len(d["tokens"]))
    return d["tokens"][:n]


def test_dense_is_the_unstopped_chain_cut(zoo, full, tau):
    stopped = _dense(zoo, tau)
    cut = 0
    for a, b in zip(full, stopped):
        assert a.output == b.output
        for ra, rb in zip(a.records, b.records):
            for n in CHAIN:
                want = _cut(ra["drafts"][n], tau[n])
                assert rb["drafts"][n]["tokens"] == want, (n, ra["pos"])
                assert rb["drafts"][n]["accepted"] == min(ra["drafts"][n]["accepted"], len(want))
                cut += len(want) < len(ra["drafts"][n]["tokens"])
    assert cut > 100  # the rule did cut, for every drafter about half the drafts


def test_zero_changes_nothing(zoo, full):
    zero = _dense(zoo, 0.0)
    for a, b in zip(full, zero):
        assert [r["drafts"] for r in a.records] == [r["drafts"] for r in b.records]
    d = _drafters(zoo)["e3"]
    assert "stop_below" not in d.info()["settings"]  # a run without it keeps its manifest's settings


def test_live_walks_the_dense_trajectory(zoo, tau):
    dres = _dense(zoo, tau)
    live_d = _drafters(zoo, tau)
    for name in CHAIN:
        eng = Engine(Target(zoo["model"], zoo["tok"]), {name: live_d[name]}, RunConfig("live", K, MAX_NEW, 0.0))
        for p, dr in zip(_prompts(zoo), dres):
            lr = eng.run_prompt(*p)
            assert lr.output == dr.output
            pos, traj = 0, []
            while pos < len(dr.output):
                a = dr.records[pos]["drafts"][name]["accepted"]
                traj.append((pos, a, dr.records[pos]["drafts"][name]["tokens"]))
                pos += a + 1
            got = [(r["pos"], r["drafts"][name]["accepted"], r["drafts"][name]["tokens"]) for r in lr.records]
            assert got == traj, name


def test_a_live_call_runs_one_step_per_drafted_token(zoo, tau):
    d = _drafters(zoo, tau)["e3"]
    steps, inner = [], d.model.step

    def counted(*a, **kw):
        steps[-1] += 1
        return inner(*a, **kw)

    d.model.step = counted
    draft = d.draft

    def per_call(pre, k):
        steps.append(0)
        out = draft(pre, k)
        steps[-1] = (steps[-1], len(out.tokens))
        return out

    d.draft = per_call
    Engine(Target(zoo["model"], zoo["tok"]), {"e3": d}, RunConfig("live", K, MAX_NEW, 0.0)).run_prompt(
        *_prompts(zoo, 1)[0]
    )
    calls = [s for s in steps if isinstance(s, tuple) and s[1]]
    assert calls and all(n_steps == n_tok for n_steps, n_tok in calls)  # one catch-up, then one per further token
    assert any(n_tok < K for _, n_tok in calls)


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "abc", "true"])
@pytest.mark.parametrize("name", CHAIN)
def test_bad_value_is_one_line(zoo, name, bad):
    spec = _with(zoo["base"][name], "stop_below", bad)
    with pytest.raises(HarnessError, match=r"stop_below=.*(number|expected)") as e:
        build_drafters([parse_spec(spec)], DrafterEnv(zoo["model"], zoo["tok"], zoo["target"]))
    assert "\n" not in str(e.value) and spec.split("=", 1)[0] in str(e.value)


def test_a_one_forward_drafter_refuses_it(zoo):
    with pytest.raises(HarnessError, match="unknown setting"):
        build_drafters(
            [parse_spec(f"medusa=medusa:path={zoo['root'] / 'medusa'},stop_below=0.4")],
            DrafterEnv(zoo["model"], zoo["tok"], zoo["target"]),
        )
