"""Independent parts of a report computed on the machine's cores, their results in report order.

A report such as `python bandit/core.py` is a sequence of sections that share only the loaded table and
each fix their own seeds, so computing them on forked workers gives the same bytes as computing them in
turn (tests/test_parallel.py checks both ways on one table). Workers are forked after the table is loaded,
so they read it without a copy; where fork is unavailable, or one core is, the sections run in turn.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterator, Sequence

from tqdm import tqdm

_TASKS: list[Callable[[], object]] = []  # the sections of the running call, read by the forked workers


def _task(i: int) -> object:
    return _TASKS[i]()


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def workers_for(n_tasks: int, workers: int | None = None) -> int:
    """How many processes `in_order` uses for n_tasks: 1 (in turn, here) without fork or inside a worker."""
    if "fork" not in mp.get_all_start_methods() or _TASKS:  # no nesting: a worker runs its part in turn
        return 1
    return max(1, min(cores() if workers is None else workers, n_tasks))


def in_order(
    tasks: Sequence[Callable[[], object]],
    workers: int | None = None,
    first: Sequence[int] = (),
    desc: str = "",
) -> Iterator[object]:
    """Each task's result, in the order of `tasks`, as soon as it and those before it are done.

    workers: processes (default: the cores, at most one per task); 1 runs the tasks in turn here.
    first: indices to start first (the longest), so that the workers finish together.
    desc: a progress bar over the finished tasks on stderr (the tasks' own bars belong to a run in turn).
    """
    n = workers_for(len(tasks), workers)
    bar = tqdm(total=len(tasks), desc=desc, disable=not desc, file=sys.stderr, leave=False)
    try:
        if n == 1:
            for f in tasks:
                yield f()
                bar.update()
            return
        order = [*first, *(i for i in range(len(tasks)) if i not in set(first))]
        _TASKS[:] = tasks
        try:
            with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as ex:
                futures = {i: ex.submit(_task, i) for i in order}
                for i in range(len(tasks)):
                    yield futures[i].result()
                    bar.update()
        finally:
            _TASKS.clear()
    finally:
        bar.close()
