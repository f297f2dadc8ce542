"""A policy's Context.draft_len in replay is what it is live: a drafter that stops its own chain (stop_below) is
shown the length it was asked for, not the cut length the dense log records (known only after it drafts)."""

import numpy as np

from bandit.logs.schema import stopping_drafters
from bandit.policies.walk import context_lengths, walk
from bandit.sim.simulate import SimConfig, simulate_table


def _with_stop(t, entries):
    from dataclasses import replace

    return replace(t, manifests=({**(t.manifests[0] if t.manifests else {}), "drafters": entries, "k": 4},))


def test_a_stopping_drafter_is_shown_the_asked_length():
    t = simulate_table(SimConfig(n_prompts=6, out_len=40, seed=0))
    names = t.drafters
    entries = {n: {"kind": "eagle3", "settings": {}} for n in names}
    entries[names[0]] = {"kind": "eagle3", "settings": {"stop_below": 0.4}}
    ts = _with_stop(t, entries)
    assert stopping_drafters(names, entries) == (names[0],)
    got = context_lengths(ts)
    others = t.draft_len[:, 1:].max(1)
    assert np.array_equal(got[:, 0], others)  # the longest draft of the drafters that do not stop
    assert np.array_equal(got[:, 1:], t.draft_len[:, 1:])  # every other column as logged
    assert context_lengths(t) is t.draft_len  # no stopping drafter: the log's own column


def test_the_replay_tells_the_policy_the_asked_length():
    t = simulate_table(SimConfig(n_prompts=6, out_len=40, seed=1))
    entries = {n: {"kind": "eagle3", "settings": {}} for n in t.drafters}
    entries[t.drafters[0]]["settings"] = {"stop_below": 0.4}
    from dataclasses import replace

    cut = t.draft_len.copy()
    cut[:, 0] = np.minimum(cut[:, 0], 1)  # drafter 0's chains all stopped after their first token
    ts = replace(_with_stop(t, entries), draft_len=cut)
    seen = []

    class Spy:
        name, full_information = "spy", True

        def reset(self, drafters, workloads, timing):
            pass

        def choose(self, ctx):
            seen.append(ctx.draft_len.copy())
            return 0

        def update(self, *a, **kw):
            pass

    rows = walk(ts, Spy(), mode="trajectory")[0]
    want = context_lengths(ts)
    assert len(seen) == len(rows) > 0 and all(np.array_equal(s, want[r]) for s, r in zip(seen, rows))
    assert sum(int(s[0]) > 1 for s in seen) > len(seen) // 2  # told the asked length, not the cut one
