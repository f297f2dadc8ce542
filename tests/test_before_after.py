"""bench/before_after.py: the host phrase names the forward that ran, and a verdict that flips is listed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import before_after


def test_the_host_phrase_names_the_forward():
    lean = {"hardware": {"cpu": "AMD EPYC", "threads": 2}, "kernels": {"kernels": "mkldnn", "forward": "lean"}}
    hf = {"hardware": {"cpu": "AMD EPYC", "threads": 2}, "kernels": {"kernels": "mkldnn"}}
    assert before_after.host(lean) == "AMD EPYC, 2 thread(s), mkldnn linears, the lean forward"
    assert before_after.host(hf) == "AMD EPYC, 2 thread(s), mkldnn linears, transformers' forward"
    assert before_after.host({}) == "?, 1 thread(s), aten linears, transformers' forward"


def test_a_flipped_verdict_is_listed_and_a_kept_one_is_not():
    def e(verdict, config):
        return {"verdict": verdict, "config": config}

    old = {"choosing_pays": e("not resolved", "policy:selector"), "choosing_pays[chat]": e("yes", "policy:hvd")}
    new = {"choosing_pays": e("yes", "policy:selector"), "choosing_pays[chat]": e("yes", "policy:hvd")}
    got = before_after.verdicts(old, new)
    assert got == ["- `choosing_pays`: not resolved (policy:selector) -> yes (policy:selector)"]
    assert before_after.verdicts(new, new) == ["- none: every live verdict stands"]
