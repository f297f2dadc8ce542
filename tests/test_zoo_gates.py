"""The zoo cards' output-quality gates (`zoo.cards`): loop detection, per-workload output
statistics from a run's progress.jsonl, and the gates built from them. No model is loaded."""

import json
import random
import re

import pytest

from zoo.cards import (
    MAX_LOOP_SHARE,
    MIN_LONG_SHARE,
    MIN_OUTPUT,
    WELL_ABOVE_ZERO,
    ends_in_loop,
    output_gates,
    output_stats,
)


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([7] * 4, True),  # period 1, exactly 4 repeats
        ([1, 2] * 4, True),  # period 2
        ([1, 2, 3] * 4, True),  # period 3
        ([1, 2, 3, 4] * 4, True),  # period 4
        ([9, 8, 5, 6, 1, 2, 3, 4] + [5, 6, 7] * 4, True),  # a loop after a non-loop start
        ([7] * 3, False),  # 3 repeats
        ([1, 2] * 3, False),
        ([1, 2, 3] * 3, False),
        ([5, 1, 2, 3, 4] * 3 + [1, 2, 3, 4], False),  # 1,2,3,4 twice, after a period-5 loop
        ([1, 2, 3, 4, 5] * 4, False),  # period 5 is beyond max_period
        ([1, 2, 3, 4, 5] * 10, False),
        ([], False),
        ([3], False),
        ([3, 3], False),
        ([3, 3, 3], False),
        ([1, 1, 1, 1, 2], False),  # a loop that does not reach the end
        ([1, 2] * 8 + [3], False),
        (list(range(40)), False),
        ([4, 1, 2, 1, 2, 1, 2, 1], False),  # 2,1 three times, after 4,1
        ([2, 1, 2, 1, 2, 1, 2, 1], True),
    ],
)
def test_ends_in_loop_hand_made(tokens, expected):
    assert ends_in_loop(tokens) is expected
    assert ends_in_loop(tuple(tokens)) is expected


def test_ends_in_loop_parameters():
    assert ends_in_loop([1, 2, 3, 4, 5] * 4, max_period=5)
    assert not ends_in_loop([7] * 4, min_repeats=5)
    assert ends_in_loop([7] * 5, min_repeats=5)
    assert ends_in_loop([1, 2] * 2, min_repeats=2)


def _brute_loop(tokens, max_period=4, min_repeats=4):
    """A different reading of the same rule: the output, as a string of one letter per token,
    matches a regex `(block){min_repeats}$` for a block of 1..max_period letters, checked
    against an explicit comparison of slices."""
    s = "".join(chr(ord("a") + t) for t in tokens)
    by_regex = any(re.search(r"(.{%d})\1{%d}\Z" % (p, min_repeats - 1), s) for p in range(1, max_period + 1))
    by_slices = any(
        len(tokens) >= min_repeats * p
        and all(
            tokens[len(tokens) - (r + 1) * p : len(tokens) - r * p] == tokens[len(tokens) - p :]
            for r in range(min_repeats)
        )
        for p in range(1, max_period + 1)
    )
    assert by_regex == by_slices, tokens
    return by_regex


def test_ends_in_loop_matches_brute_force_on_random_lists():
    rng = random.Random(0)
    hits = 0
    for _ in range(4000):
        alphabet = rng.randint(1, 3)
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(0, 20))]
        if rng.random() < 0.3:  # plant a loop, possibly too short, at the end
            p = rng.randint(1, 5)
            block = [rng.randrange(alphabet) for _ in range(p)]
            tokens += block * rng.randint(2, 5)
        got = ends_in_loop(tokens)
        assert got == _brute_loop(tokens), tokens
        hits += got
    assert 400 < hits < 3600  # both outcomes well exercised


def _write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_output_stats_counts_per_workload(tmp_path):
    p = _write(
        tmp_path / "progress.jsonl",
        [
            {"workload": "code", "prompt_id": "c0", "n": 1, "output": [5]},
            {"workload": "code", "prompt_id": "c1", "n": 20, "output": [1, 2] * 10},  # long, a loop
            {"workload": "math", "prompt_id": "m0", "n": 16, "output": list(range(16))},  # long, no loop
            {"workload": "code", "prompt_id": "c2", "n": 15, "output": list(range(15))},  # 15 < 16
            {"workload": "math", "prompt_id": "m1", "n": 3},  # no output: skipped
            "",  # blank line
            {"workload": "math", "prompt_id": "m2", "n": 4, "output": [0, 0, 0, 0]},  # short loop
        ],
    )
    st = output_stats(p)
    assert list(st) == ["code", "math"]
    assert {k: st["code"][k] for k in ("n", "ge16", "loop")} == {"n": 3, "ge16": 1, "loop": 1}
    assert {k: st["math"][k] for k in ("n", "ge16", "loop")} == {"n": 2, "ge16": 1, "loop": 1}
    assert st["code"]["tokens"] == 36 and st["math"]["tokens"] == 20
    assert st["code"]["missing"] == 0 and st["math"]["missing"] == 1
    assert output_stats(_write(tmp_path / "empty.jsonl", [])) == {}


@pytest.mark.parametrize(
    "bad",
    [
        '{"workload": "code", "output": [1, 2',
        "not json",
        "[1, 2]",
        '{"prompt_id": "x", "output": [1]}',
        '{"workload": "code", "output": 3}',
    ],
)
def test_output_stats_names_the_malformed_line(tmp_path, bad):
    p = _write(
        tmp_path / "progress.jsonl", [{"workload": "code", "output": [1]}, "", bad, {"workload": "code", "output": [2]}]
    )
    with pytest.raises(ValueError, match=re.escape(f"{p}:3:")):
        output_stats(p)


def _stats(**per_workload):
    """Planted stats: workload=(n, ge16, loop)."""
    return {w: dict(n=n, ge16=g, loop=lp, tokens=20 * n, missing=0) for w, (n, g, lp) in per_workload.items()}


def _gates(stats):
    (lname, lok, ldetail), (pname, pok, pdetail) = output_gates(stats)
    assert str(MIN_OUTPUT) in lname and "loop" in pname
    return lok, ldetail, pok, pdetail


def test_output_gates_pass():
    lok, ldetail, pok, pdetail = _gates(_stats(code=(200, 190, 19), math=(100, 100, 0)))
    assert lok and pok
    assert ldetail == "code 95.0%, math 100.0%"
    assert pdetail == "pooled 6.3%; code 9.5%, math 0.0%"


def test_output_length_gate_fails_on_one_short_workload():
    lok, ldetail, pok, _ = _gates(_stats(code=(300, 97, 0), chat=(300, 290, 0), math=(200, 189, 0)))
    assert not lok and pok
    assert ldetail == "code 32.3% (under 95%), chat 96.7%, math 94.5% (under 95%)"
    assert not _gates(_stats(code=(200, 189, 0)))[0]  # just under: 94.5%
    assert _gates(_stats(code=(20, 19, 0)))[0]  # exactly 95%


def test_loop_gate_is_pooled_and_names_workloads_over_the_limit():
    # code alone is over 10%, but the pooled share is 21/300 = 7.0%: passes, and code is named
    lok, _, pok, pdetail = _gates(_stats(code=(100, 100, 21), chat=(200, 200, 0)))
    assert lok and pok
    assert pdetail == "pooled 7.0%; code 21.0% (over 10%), chat 0.0%"
    # pooled exactly 10% fails (fewer than 10% required); just under passes
    assert not _gates(_stats(code=(100, 100, 10)))[2]
    assert _gates(_stats(code=(1000, 1000, 99)))[2]
    lok, _, pok, pdetail = _gates(_stats(code=(100, 100, 30), chat=(100, 100, 5)))
    assert not pok and pdetail == "pooled 17.5%; code 30.0% (over 10%), chat 5.0%"


def test_output_gates_fail_without_outputs():
    lok, ldetail, pok, pdetail = _gates({})
    assert not lok and not pok and ldetail == "no outputs"
    lok, ldetail, pok, pdetail = _gates(_stats(code=(50, 50, 0), chat=(0, 0, 0)))
    assert not lok and ldetail == "code 100.0%, chat no outputs"
    assert pok and pdetail == "pooled 0.0%; code 0.0%, chat no outputs"


def test_thresholds():
    assert (WELL_ABOVE_ZERO, MIN_OUTPUT, MIN_LONG_SHARE, MAX_LOOP_SHARE) == (0.3, 16, 0.95, 0.10)
