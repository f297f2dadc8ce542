"""bandit/logs/parallel.py: report sections on forked workers give the same results, in report order, as in turn."""

import os
import time

import pytest

from bandit import core
from bandit.logs import parallel
from bandit.sim.simulate import SimConfig, write_sim_run

fork = pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="no fork")


def slow(i: int, s: float):
    def f():
        time.sleep(s)
        return (i, os.getpid())

    return f


@fork
def test_results_come_in_task_order_from_other_processes():
    tasks = [slow(0, 0.3), slow(1, 0.0), slow(2, 0.1)]  # the first is the slowest: order must not follow finishing
    got = list(parallel.in_order(tasks, workers=2, first=(0,)))
    assert [i for i, _ in got] == [0, 1, 2]
    assert all(pid != os.getpid() for _, pid in got)  # computed in workers
    assert {pid for _, pid in list(parallel.in_order(tasks, workers=1))} == {os.getpid()}  # in turn, here


@fork
def test_an_error_in_a_worker_reaches_the_caller():
    def bad():
        raise ValueError("planted")

    with pytest.raises(ValueError, match="planted"):
        list(parallel.in_order([slow(0, 0.0), bad], workers=2))
    assert parallel.workers_for(3, 2) == 2  # nothing left registered after the failure


@fork
def test_core_report_is_byte_identical_in_turn_and_on_two_workers(tmp_path, monkeypatch):
    run = tmp_path / "camp"
    write_sim_run(SimConfig(n_prompts=3, out_len=30, seed=5), run, gz=False)
    kw = dict(seeds=(0,), n_resamples=50, order_seeds=3, replicates=1, out=None)
    monkeypatch.setattr(parallel, "cores", lambda: 1)
    one = core.main([str(run)], **kw)
    monkeypatch.setattr(parallel, "cores", lambda: 2)
    assert parallel.workers_for(5) == 2
    two = core.main([str(run)], **kw)
    assert two == one and "falsif" in one
