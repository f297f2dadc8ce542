"""bench/bench_harness.py compares equal work only: a speed ratio is printed only when both
sides produced the same tokens for every prompt, and a row whose outputs differ is refused
with the prompt and position of the first difference."""

import importlib.util
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_harness.py"
RATIO = re.compile(r"\b\d+\.\d\dx")  # a printed ratio; the targets' "1.0x", "3x", "5x" have fewer decimals
ROWS = (
    "draft model",
    "prompt lookup",
    "  ours (teacher-forced)",
    "  ours, y by ngram spec.",
    "  naive k steps/position",
    "  naive vs y by ngram spec.",
)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_harness", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_equal_lists_are_equal_work(bench):
    assert bench.equal_work([[1, 2, 3], [4]], [[1, 2, 3], [4]]) == (True, "")
    assert bench.equal_work([], []) == (True, "")


def test_one_token_differs(bench):
    ok, why = bench.equal_work([[1, 2], [5, 6, 7], [8, 9]], [[1, 2], [5, 0, 7], [8, 0]])
    assert not ok
    assert why == "outputs differ on 2 of 3 prompts (first at prompt 1, position 1)"


def test_length_differs(bench):
    # our loop stopped at EOS, the other side ran on past it: the first extra token is the difference
    ok, why = bench.equal_work([[3, 4, 2]], [[3, 4, 2, 7, 7]])
    assert not ok and why == "outputs differ on 1 of 1 prompts (first at prompt 0, position 3)"
    ok, why = bench.equal_work([[1], [2]], [[1]])
    assert not ok and "2 vs 1 prompts" in why


def test_ratio_cell(bench):
    assert bench.ratio_cell(3.0, 2.0, ([[1]], [[1]], "outputs")) == (True, "1.50x")
    ok, cell = bench.ratio_cell(3.0, 2.0, ([[1]], [[1]], "outputs"), ([[1, 2]], [[1, 3]], "drafts"))
    assert not ok and cell == "refused: drafts differ on 1 of 1 prompts (first at prompt 0, position 1)"
    assert not RATIO.search(cell)


def _rows(out: str) -> dict:
    rows = {line[:28].rstrip(): line for line in out.splitlines() if line[:28].rstrip() in ROWS}
    assert set(rows) == set(ROWS), out
    return rows


def _check_rows(rows: dict) -> None:
    for label, line in rows.items():
        if RATIO.search(line):  # a ratio is printed only over identical outputs
            assert re.search(r"\sTrue\s", line) and "refused" not in line and "False" not in line, line
        else:
            assert "refused: " in line and "differ on" in line and re.search(r"\sFalse\s", line), line


def test_bench_main_tiny(bench, capsys):
    assert bench.main(["--max-new-tokens", "16", "--reps", "1"]) == 0
    _check_rows(_rows(capsys.readouterr().out))


def test_bench_main_refuses_unequal_work(bench, capsys, monkeypatch):
    """Our live loop made to stop one token early: both live rows are refused, not credited."""

    class Short(bench.Engine):
        def run_prompt(self, *a, **kw):
            res = super().run_prompt(*a, **kw)
            if self.cfg.mode == "live":
                res.output = res.output[:-1]
            return res

    monkeypatch.setattr(bench, "Engine", Short)
    assert bench.main(["--max-new-tokens", "12", "--reps", "1"]) == 0
    rows = _rows(capsys.readouterr().out)
    _check_rows(rows)
    for label in ("draft model", "prompt lookup"):
        assert re.search(r"refused: outputs differ on 4 of 4 prompts \(first at prompt 0, position \d+\)", rows[label])
