"""A killed campaign parent (`python -m harness.smollm2`) ends the shard processes it started (issue 35)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import sys
from harness.campaign import smollm2
child = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"]
smollm2.run_side_by_side([child, child], dry=False)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, whoever reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_parent_ends_its_shards(tmp_path):
    err = (tmp_path / "stderr").open("w+")
    p = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, stderr=err, text=True)
    pids: list[int] = []
    while len(pids) < 2:  # the parent prints each command ("$ ..."), the shards their pids
        line = p.stdout.readline()
        if not line:
            err.seek(0)
            pytest.fail(f"the parent ended early (exit {p.wait()}): {err.read()[-2000:]}")
        if line.strip().isdigit():
            pids.append(int(line))
    assert all(_alive(x) for x in pids)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    while any(_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(x) for x in pids)
