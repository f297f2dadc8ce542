"""Replay statistics by hand, the trajectory oracle against brute force, the feedback model, the CLI."""

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandit.logs.reader import load_logs
from bandit.logs.table import BlockTable, is_dense
from bandit.replay import mean_table, summarize
from bandit.logs.schema import Context
from bandit.stats.trajectory import fixed_trajectory, trajectory_oracle
from bandit.policies.walk import FixedPolicy, block_replay, trajectory_replay
from bandit.sim.simulate import SimConfig, simulate_table, write_sim_run

DATA = Path(__file__).parent / "data"


def _dense_table(acc_by_prompt: list[np.ndarray], workload_of_prompt=None) -> BlockTable:
    """A dense table from per-prompt (n_p, D) accepted arrays (no block flags: every record a block)."""
    D = acc_by_prompt[0].shape[1]
    prompt = np.concatenate([np.full(len(a), i, np.int32) for i, a in enumerate(acc_by_prompt)])
    pos = np.concatenate([np.arange(len(a)) for a in acc_by_prompt]).astype(np.int64)
    wop = (
        np.zeros(len(acc_by_prompt), np.int32)
        if workload_of_prompt is None
        else np.asarray(workload_of_prompt, np.int32)
    )
    acc = np.concatenate(acc_by_prompt).astype(np.int32)
    R = len(pos)
    return BlockTable(
        drafters=tuple(f"d{j}" for j in range(D)),
        workloads=tuple(f"w{i}" for i in range(wop.max() + 1)),
        prompt_ids=tuple(f"p{i}" for i in range(len(acc_by_prompt))),
        workload=wop[prompt],
        prompt=prompt,
        pos=pos,
        block=np.full(R, -1, np.int64),
        accepted=acc,
        draft_len=np.full((R, D), 8, np.int32),
        expected_accepted=np.full((R, D), np.nan),
        features=np.zeros((R, D, 4)),
        ms=np.full((R, D), np.nan),
        target_ms=np.full(R, np.nan),
        dense=is_dense(prompt, pos),
    )


def _brute_force_passes(acc: np.ndarray) -> int:
    """Fewest passes over every sequence of (drafter, cut) choices (acc: (n, D)); a draft cut to L accepts
    min(a, L), so a block at pos may produce any 1..a_d(pos)+1 tokens of any drafter d."""
    n, D = acc.shape
    best = n + 1
    moves = [sorted({L + 1 for d in range(D) for L in range(int(acc[p, d]) + 1)}) for p in range(n)]
    for seq in itertools.product(range(max(len(m) for m in moves)), repeat=n):  # at most n blocks
        pos, passes = 0, 0
        for i in seq:
            if pos >= n:
                break
            if i >= len(moves[pos]):
                passes = n + 1
                break
            pos += moves[pos][i]
            passes += 1
        if pos >= n:
            best = min(best, passes)
    return best


def test_trajectory_oracle_against_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n, D = int(rng.integers(1, 7)), int(rng.integers(1, 4))
        acc = [np.minimum(rng.integers(0, 4, (n, D)), (n - 1 - np.arange(n))[:, None]) for _ in range(2)]
        t = _dense_table(acc)
        assert trajectory_oracle(t).passes.tolist() == [_brute_force_passes(a) for a in acc], trial


def test_oracle_equals_greedy_on_teacher_forced_logs():
    """Teacher forcing makes pos + a_d(pos) + 1 non-decreasing in pos, so jumping furthest is optimal."""
    t = simulate_table(SimConfig(n_prompts=5, out_len=60, seed=1))

    class Greedy(FixedPolicy):
        def choose(self, ctx):
            return int(np.argmax(t.accepted[np.flatnonzero((t.prompt == ctx.prompt) & (t.pos == ctx.pos))[0]]))

    assert trajectory_replay(t, Greedy(0)).passes.tolist() == trajectory_oracle(t).passes.tolist()


def test_policy_trajectory_equals_vectorised_fixed():
    t = simulate_table(SimConfig(n_prompts=3, out_len=50, seed=2))
    for d in range(len(t.drafters)):
        slow, fast = trajectory_replay(t, FixedPolicy(d)), fixed_trajectory(t, d)
        assert slow.passes.tolist() == fast.passes.tolist()
        assert slow.tokens_per_pass == fast.tokens_per_pass
    o = trajectory_oracle(t).tokens_per_pass
    assert all(o >= fixed_trajectory(t, d).tokens_per_pass for d in range(4))


def test_cutting_a_draft_can_beat_every_whole_draft_trajectory():
    """Stop early to land on a position where another drafter goes far: the oracle must allow it."""
    acc = np.zeros((12, 2), int)
    acc[0] = [4, 4]
    acc[1] = [10, 0]
    t = _dense_table([acc])
    assert trajectory_oracle(t).passes.tolist() == [2]  # pos 0 cut to 0 accepted -> pos 1 -> +11 = 12
    assert min(fixed_trajectory(t, d).passes[0] for d in range(2)) > 2


def test_sparse_statistics_by_hand():
    s = summarize(load_logs([DATA / "blocks_tiny_sparse.jsonl"]))
    # block starts: a: x (3,2,1) y (1,3,0); b: x (0,1) y (2,4); a/p2 pos 1 is not a block start
    np.testing.assert_allclose(s.table, [[2.0, 4 / 3], [0.5, 3.0]])
    np.testing.assert_allclose(s.pooled, [7 / 5, 10 / 5])
    assert s.best_fixed_name == "y" and s.n_blocks == 5 and s.n_prompts == 3
    assert s.workload_oracle == pytest.approx((3 * 2.0 + 2 * 3.0) / 5)  # a uses x, b uses y
    assert s.workload_headroom == pytest.approx(2.4 / 2.0 - 1)
    assert s.per_block_oracle == pytest.approx((3 + 3 + 1 + 2 + 4) / 5)
    assert s.per_block_gap == pytest.approx(2.6 / 2.0 - 1)
    assert s.trajectory is None and s.label == "UNLABELLED"


def test_dense_statistics_and_trajectories_by_hand():
    t = load_logs([DATA / "blocks_tiny_dense.jsonl"])
    s = summarize(t)
    # q (5 tokens): x starts 0,3,4 (3 passes), y 0,2 (2); r (3 tokens): x 0,2 (2), y 0,1,2 (3): a tie at 5 passes,
    # so the primary is the first drafter, x, and B = x's starts: q 0,3,4 and r 0,2
    assert s.best_fixed_name == "x" and s.n_blocks == 5
    np.testing.assert_allclose(s.pooled, [3 / 5, 1 / 5])
    assert s.per_block_gap == pytest.approx(0.0)  # at x's own starts nothing beats x
    # ...while the length-biased mean over every position says +50%
    assert s.per_position["per_block_gap_per_position"] == pytest.approx(6 / 8 / 0.5 - 1)
    # oracle: q 0 -y-> 2 -y-> 5, r 0 -x-> 2 -> 3: 4 passes; greedy: q 0 -x-> 3 -> 4 -> 5, r as x: 5 passes
    assert s.trajectory == pytest.approx({"x": 8 / 5, "y": 8 / 5, "greedy_oracle": 8 / 5, "oracle": 8 / 4})
    assert trajectory_oracle(t).passes.tolist() == [2, 2]
    assert fixed_trajectory(t, 0).passes.tolist() == [3, 2]


def _two_workloads() -> BlockTable:
    # w0/p0: d0 accepts everything at 0 (1 pass), d1 0 -> 1 -> 4 (2 passes);
    # w1/p1: d0 accepts nothing (4 passes), d1 0 -> 2 -> 4 (2 passes). Primary d1 (4 passes against 5).
    return _dense_table(
        [np.array([[3, 0], [0, 2], [0, 0], [0, 0]]), np.array([[0, 1], [0, 0], [0, 1], [0, 0]])],
        workload_of_prompt=[0, 1],
    )


def test_positional_and_trajectory_statistics_disagree_by_construction():
    from bandit.stats import trajectory

    t = _two_workloads()
    assert trajectory.primary(t) == 1
    b = trajectory.block_set(t)
    assert b.pos.tolist() == [0, 1, 0, 2] and b.block.tolist() == [0, 1, 0, 1]
    s = summarize(t)
    assert s.best_fixed_name == "d1" and s.n_blocks == 4
    np.testing.assert_allclose(s.table, [[1.5, 1.0], [0.0, 1.0]])
    assert s.per_block_gap == pytest.approx(7 / 4 - 1)  # blocks: max 3, 2, 1, 1
    assert s.per_position["per_block_gap_per_position"] == pytest.approx(7 / 8 / 0.5 - 1)  # positions: 3,2,0,0,1,0,1,0
    # workloads on their own best: w0 d0 (1 pass), w1 d1 (2): 8 tokens in 3 passes against d1's 8 in 4
    assert s.workload_headroom == pytest.approx((8 / 3) / 2 - 1)
    assert s.per_position["workload_headroom_per_position"] == pytest.approx(0.625 / 0.5 - 1)
    np.testing.assert_allclose(s.trajectory_table, [[4.0, 2.0], [1.0, 2.0]])
    assert s.trajectory["oracle"] == pytest.approx(8 / 3) and s.trajectory["greedy_oracle"] == pytest.approx(8 / 3)


def test_block_marks_do_not_change_dense_numbers():
    """Marks equal to the primary's starts, other marks, or none: a dense log's numbers are the same."""
    from bandit.stats import trajectory

    t = _two_workloads()
    starts = trajectory.fixed_starts(t)
    base = summarize(t).to_json()
    for marks in (starts[:, 1], starts[:, 0], np.ones(t.n_records, bool)):
        blk = np.where(marks, np.arange(t.n_records), -1).astype(np.int64)
        assert summarize(replace(t, block=blk)).to_json() == base


def test_sparse_log_of_the_primarys_starts_agrees_with_the_dense_log():
    from bandit.stats import trajectory

    t = _two_workloads()
    b = trajectory.block_set(t)
    sparse = replace(b, dense=False)
    s, d = summarize(sparse), summarize(t)
    assert s.best_fixed_name == d.best_fixed_name
    assert s.per_block_gap == pytest.approx(d.per_block_gap)
    np.testing.assert_allclose(s.table, d.table)


def test_no_trajectory_exceeds_the_shortest_path():
    rng = np.random.default_rng(4)
    for trial in range(20):
        acc = [rng.integers(0, 4, (int(rng.integers(3, 12)), 3)) for _ in range(4)]
        t = _dense_table(acc, workload_of_prompt=[0, 0, 1, 1])
        s = summarize(t)
        assert max(v for k, v in s.trajectory.items() if k != "oracle") <= s.trajectory["oracle"] + 1e-12, trial
        assert s.workload_oracle <= s.trajectory["oracle"] + 1e-12


class Recorder:
    """Chooses drafter `pick` (cut at `cut` if given) and records what the replay showed it."""

    def __init__(self, pick: int, full: bool, cut: int | None = None):
        self.pick, self.full_information, self.cut, self.name = pick, full, cut, "recorder"
        self.seen: list = []

    def reset(self, drafters, workloads, timing=None):
        self.seen.clear()

    def choose(self, ctx: Context):
        return self.pick if self.cut is None else (self.pick, self.cut)

    def update(self, ctx, chosen, accepted, observed):
        self.seen.append((ctx, chosen, accepted.copy(), observed.copy()))


def test_block_replay_feedback_model():
    t = load_logs([DATA / "blocks_tiny_sparse.jsonl"])
    bandit, full = Recorder(1, False), Recorder(1, True)
    r = block_replay(t, bandit)
    block_replay(t, full)
    assert r.reward.tolist() == [1, 3, 0, 2, 4] and r.cluster.tolist() == [0, 0, 1, 2, 2]
    ctx0, _, acc, obs = bandit.seen[0]
    assert np.isnan(ctx0.prev_accepted).all() and np.isnan(ctx0.prev_features).all()  # first block
    assert obs.tolist() == [False, True] and np.isnan(acc[0]) and acc[1] == 1  # bandit feedback
    ctx1 = bandit.seen[1][0]
    assert np.isnan(ctx1.prev_accepted[0]) and ctx1.prev_accepted[1] == 1 and ctx1.pos == 4
    assert np.isnan(ctx1.prev_features[0]).all() and not np.isnan(ctx1.prev_features[1]).any()
    assert full.seen[0][2].tolist() == [3, 1] and full.seen[0][3].all()  # full information
    assert np.isnan(bandit.seen[2][0].prev_accepted).all()  # a new prompt
    cut = block_replay(t, Recorder(1, False, cut=2))
    assert cut.reward.tolist() == [1, 2, 0, 2, 2] and cut.cut.tolist() == [2] * 5  # accepts min(a, L)


def test_block_replay_prompt_order():
    t = load_logs([DATA / "blocks_tiny_sparse.jsonl"])
    r = block_replay(t, FixedPolicy(0), prompt_order=np.array([2, 0, 1]))
    assert r.cluster.tolist() == [2, 2, 0, 0, 1] and r.reward.tolist() == [0, 1, 3, 2, 1]


def test_trajectory_needs_dense():
    t = load_logs([DATA / "blocks_tiny_sparse.jsonl"])
    with pytest.raises(ValueError, match="dense"):
        trajectory_replay(t, FixedPolicy(0))
    with pytest.raises(ValueError, match="dense"):
        trajectory_oracle(t)


def test_mean_table_independent_computation():
    t = simulate_table(SimConfig(n_prompts=4, out_len=30, seed=3))
    for w in range(len(t.workloads)):
        for d in range(len(t.drafters)):
            vals = [int(t.accepted[i, d]) for i in range(t.n_records) if t.workload[i] == w]
            assert mean_table(t)[w, d] == pytest.approx(sum(vals) / len(vals))


def test_cli_replay_json_equals_independent_computation(tmp_path):
    """The JSON's numbers recomputed from the raw lines with plain Python (a dense simulated log)."""
    from typer.testing import CliRunner
    from specbandit_cli import app
    import gzip

    path = write_sim_run(SimConfig(n_prompts=2, out_len=40, seed=12), tmp_path / "run")
    names = ["cascade", "dflash", "ngram"]
    r = CliRunner().invoke(app, ["replay", str(path), "--json", "--drafters", ",".join(names), "--resamples", "0"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    recs = [json.loads(l) for l in gzip.decompress(path.read_bytes()).decode().splitlines()]
    by = {(x["workload"], x["prompt_id"], x["pos"]): x for x in recs}
    lengths = {}
    for w, p, pos in by:
        lengths[(w, p)] = max(lengths.get((w, p), 0), pos + 1)
    starts = {d: [] for d in names}
    for d in names:
        for (w, p), n in sorted(lengths.items()):
            pos = 0
            while pos < n:
                starts[d].append(by[(w, p, pos)])
                pos += by[(w, p, pos)]["drafts"][d]["accepted"] + 1
        assert out["trajectory"][d] == pytest.approx(sum(lengths.values()) / len(starts[d]))
    best = min(names, key=lambda d: (len(starts[d]), names.index(d)))  # fewest passes, first on ties
    assert out["primary"] == best
    blocks = starts[best]
    acc = {d: [x["drafts"][d]["accepted"] for x in blocks] for d in names}
    pooled = {d: sum(v) / len(v) for d, v in acc.items()}
    assert out["pooled"] == pytest.approx(pooled) and out["n_blocks"] == len(blocks)
    per_block = sum(max(x["drafts"][d]["accepted"] for d in names) for x in blocks) / len(blocks)
    assert out["per_block_gap"] == pytest.approx(per_block / pooled[best] - 1)
    wls = sorted({x["workload"] for x in blocks})
    table = {
        w: {d: np.mean([x["drafts"][d]["accepted"] for x in blocks if x["workload"] == w]) for d in names} for w in wls
    }
    for w in wls:
        assert out["table"][w] == pytest.approx(table[w])
    passes_w = {w: {d: sum(x["workload"] == w for x in starts[d]) for d in names} for w in wls}
    tok_w = {w: sum(n for (ww, _), n in lengths.items() if ww == w) for w in wls}
    oracle = sum(tok_w.values()) / sum(min(passes_w[w].values()) for w in wls)
    assert out["workload_headroom"] == pytest.approx(oracle / out["trajectory"][best] - 1)
    assert out["trajectory"]["oracle"] >= max(out["trajectory"][d] for d in names)
    assert set(out) >= {
        "table",
        "pooled",
        "primary",
        "workload_headroom",
        "per_block_gap",
        "n_blocks",
        "trajectory",
        "per_position",
        "block_set",
    }


def test_shipped_sim_campaign_is_reproducible(tmp_path):
    shipped = Path(__file__).parents[1] / "runs" / "sim"
    path = write_sim_run(SimConfig(), tmp_path / "sim")
    assert path.read_bytes() == (shipped / "blocks_sim.jsonl.gz").read_bytes()
    assert (tmp_path / "sim" / "manifest.json").read_text() == (shipped / "manifest.json").read_text()


def test_summary_grids_keep_long_drafter_names_apart():
    """A drafter name longer than a column (eagle3_stop beside eagle3) printed as one word in the grids' header
    ("eagle3eagle3_stop"): every header and row must split on whitespace into one field per column."""
    rng = np.random.default_rng(0)
    t = _dense_table([rng.integers(0, 5, (12, 3)) for _ in range(4)], [0, 0, 1, 1])
    names = ("eagle3", "eagle3_stop", "suffix_arctic_long_name")
    s = summarize(replace(t, drafters=names)).summary().splitlines()
    heads = [i for i, line in enumerate(s) if line.startswith("workload")]
    assert len(heads) == 2  # the trajectory grid and the block-set grid
    for i in heads:
        assert s[i].split()[1:4] == list(names)
        ends = [s[i].index(n) + len(n) for n in names]  # each name's right edge in the header
        for row in s[i + 1 : i + 4]:  # two workloads and pooled: each number (and its star's place) under its name
            assert [row[e - 1] in "* " and row[e - 2].isdigit() for e in ends] == [True] * len(names), row
