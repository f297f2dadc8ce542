"""Seeded fuzzing of the readers (issue 24): whatever the bytes, a reader either reads them or raises the
project's one-line InputError; never another exception, never a value out of range accepted silently.

hypothesis drives it with a fixed seed (derandomize), so the suite is reproducible.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandit.logs.errors import InputError
from bandit.logs.reader import load_logs
from bandit.logs.observed import COUNTERS, MAX_POS, PER_POS, read_vllm_metrics

SETTINGS = settings(
    max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(COUNTERS + (PER_POS, "other")), numbers | st.lists(numbers, max_size=80)))
def test_observed_counters_read_or_refused(tmp_path, values):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(values))
    try:
        m = read_vllm_metrics(p)
    except InputError:
        return
    assert all(isinstance(m[c], int) and 0 <= m[c] < 2**63 for c in COUNTERS)
    assert len(m["accepted_per_pos"]) <= MAX_POS
    assert all(isinstance(v, int) and v >= 0 for v in m["accepted_per_pos"])


@SETTINGS
@given(
    lines=st.lists(
        st.tuples(
            st.sampled_from(COUNTERS + (PER_POS,)),
            st.text(alphabet='0123456789position="{},ab', max_size=20),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6)),
        ),
        max_size=12,
    )
)
def test_prometheus_text_read_or_refused(tmp_path, lines):
    text = "\n".join(f"vllm:spec_decode_{n}_total{{{lab}}} {v}" for n, lab, v in lines)
    p = tmp_path / "m.txt"
    p.write_text(text)
    try:
        m = read_vllm_metrics(p)
    except InputError:
        return
    assert all(math.isfinite(m[c]) for c in COUNTERS) and len(m["accepted_per_pos"]) <= MAX_POS


GOOD = {
    "v": 1,
    "workload": "code",
    "prompt_id": "p1",
    "pos": 0,
    "drafts": {
        "a": {"tokens": [1, 2], "accepted": 1, "conf": [0.9, 0.4], "entropy": [0.1, 0.8]},
        "b": {"tokens": [3], "accepted": 0, "conf": [0.2], "entropy": [1.5]},
    },
}
FIELDS = [
    ("pos",),
    ("workload",),
    ("prompt_id",),
    ("v",),
    ("drafts", "a", "accepted"),
    ("drafts", "a", "tokens"),
    ("drafts", "b", "conf"),
    ("drafts", "a", "entropy"),
    ("drafts",),
    ("block",),
    ("target_ms",),
]


@SETTINGS
@given(
    field=st.sampled_from(FIELDS),
    value=numbers | st.lists(numbers, max_size=4) | st.dictionaries(st.text(max_size=3), numbers, max_size=2),
)
def test_block_record_fields_read_or_refused(tmp_path, field, value):
    rec = json.loads(json.dumps(GOOD))
    at = rec
    for k in field[:-1]:
        at = at[k]
    at[field[-1]] = value
    second = dict(GOOD, pos=5, drafts=GOOD["drafts"])
    p = tmp_path / "blocks_x.jsonl"
    p.write_text(json.dumps(rec, allow_nan=True) + "\n" + json.dumps(second) + "\n")
    try:
        t = load_logs([p])
    except InputError:
        return
    assert (t.accepted >= 0).all() and (t.accepted <= t.draft_len).all() and (t.pos >= 0).all()
    assert ((t.features >= 0) | ~(t.features == t.features)).all()


@pytest.mark.parametrize("cut", [1, 17, 60, -3])
def test_truncated_gz_log_is_refused_in_one_line(tmp_path, cut):
    import gzip

    raw = gzip.compress(("\n".join(json.dumps(dict(GOOD, pos=i)) for i in range(50)) + "\n").encode())
    p = tmp_path / "blocks_x.jsonl.gz"
    p.write_bytes(raw[:cut])
    with pytest.raises(InputError):
        load_logs([p])
