"""Ray as the campaign's distributed engine (`sweep.py --ray [ADDRESS]`).

One actor per GPU (or per CPU slot on a CPU host; `--workers N` to choose), each loading the models once
(harness/campaign/worker.py) and working through shards from one queue. Actors only compute: each streams its
prompts' results back as they finish, and the driver writes them into the shard's part of the run
directory (harness/campaign/rundir.py), so a Ray campaign's directory is a local run's: locked, resumable, and
its pooled records are the single process's. A shard whose actor dies (or whose task fails for a reason
other than bad input) goes back to the queue with its unfinished prompts, at most MAX_TRIES times, and a
fresh actor takes the dead one's place; bad input (a HarnessError in a worker) ends the campaign at once,
as one line.

Without an address the command starts a local Ray and stops it at the end; `auto` or `HOST:PORT` joins a
running cluster. Every worker loads the models from the path the driver resolved (a shared file system or
identical copies); they must all report the same drafter weights. Ray is an optional extra
(`pip install 'specbandit[ray]'`), imported only here, only when --ray is given.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import uuid
from collections import deque
from pathlib import Path

from bandit.logs.errors import InputError

from ..models.lm import HarnessError
from .worker import Plan, Worker

REPO = Path(__file__).resolve().parents[2]
MAX_TRIES = 3  # attempts per shard; each resumes where the last one stopped
SHARDS_PER_WORKER = 4  # a new Ray campaign's shard count: this many per worker (at most one per prompt)


def import_ray():
    try:
        import ray
    except ImportError:
        raise HarnessError("--ray: Ray is not installed here (pip install 'specbandit[ray]', i.e. ray>=2.9)") from None
    return ray


class Actor:
    """The body of each Ray actor: a Worker, loaded by `load` (so that a bad checkpoint comes back as the
    worker's own HarnessError, not as a dead actor)."""

    def load(self, plan: Plan) -> dict:
        self.worker = Worker(plan)
        return self.worker.info

    def run(self, items):
        yield from self.worker.run_items(items)

    def live(self, prompts, outputs, chosen, done, policies=None, workloads=(), timing=None):
        yield from self.worker.live(prompts, outputs, chosen, done, policies, workloads, timing)

    def policy_timing(self, prompts, outputs, chosen):
        return self.worker.policy_timing(prompts, outputs, chosen)

    def time_verify(self, prefixes, k, n_drafts):
        return self.worker.time_verify(prefixes, k, n_drafts)

    def calibrate(self, prompts):
        return self.worker.calibrate(prompts)


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


class Pool:
    """The actors of one campaign, with the driver's side of the queue (the interface of a local Worker:
    `info`, `run`, `live`, `policy_timing`, `time_verify`, `calibrate`, `close`)."""

    def __init__(self, plan: Plan, address: str | None, workers: int = 0):
        self.ray = ray = import_ray()
        self.plan, self.started = plan, not ray.is_initialized()
        if self.started:  # no address: a local Ray of this command's own, stopped at close()
            cpus = None  # Ray's count; more when --workers asks for more CPU workers than cores (oversubscribed)
            if not address and workers and not plan.device.startswith("cuda"):
                cpus = max(os.cpu_count() or 1, workers * max(1, plan.threads or 1))
            try:
                ray.init(
                    address=address or "local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise HarnessError(f"--ray {address or ''}: cannot start or join Ray: {_one_line(e)}") from None
        self.slots: list = []
        try:
            self._start(workers)
        except BaseException:
            self.close()  # a worker that cannot load the models: no actor (nor a Ray of ours) is left behind
            raise

    def _start(self, workers: int) -> None:
        ray, plan = self.ray, self.plan
        gpu = plan.device.startswith("cuda")
        self.per = {"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": max(1, plan.threads or 1)}
        unit = "GPU" if gpu else "CPU"
        each = 1 if gpu else self.per["num_cpus"]
        have = ray.cluster_resources().get(unit, 0)
        n = workers or int(have // each)
        if n < 1 or n * each > have:  # an actor Ray cannot place would wait for ever
            raise HarnessError(
                f"--ray: {n} worker(s) need {max(1, n) * each} {unit}(s) ({each} each), the cluster has {have:g}"
            )
        self.remote = ray.remote(**self.per)(Actor)
        self.tag = uuid.uuid4().hex[:8]
        self.spawned, self.budget = 0, 2 * n + MAX_TRIES  # fresh actors for dead ones, at most this many
        self.lock = threading.Lock()
        self.failures: dict[str, int] = {}  # worker id -> shard attempts that failed on it
        self.slots = [self._spawn() for _ in range(n)]
        self._load_all()

    def _load_all(self) -> None:
        infos = self._get([a.load.remote(self.plan) for a in self.slots])
        self.info, self.ids = infos[0], [x["worker"] for x in infos]
        for other in infos[1:]:
            if other["drafters"] != self.info["drafters"] or other["dtype"] != self.info["dtype"]:
                raise HarnessError(
                    f"--ray: worker {other['worker']} loaded other models than worker {self.info['worker']} "
                    "(its drafter settings or weights differ); give every node the same model files"
                )

    def _spawn(self):
        self.spawned += 1
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        opts = {"name": f"specbandit-{self.tag}-{self.spawned}", "runtime_env": {"env_vars": {"PYTHONPATH": path}}}
        return self.remote.options(**opts).remote()

    def _get(self, refs):
        """ray.get with a worker's bad-input error raised as itself (one line), not wrapped."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, InputError):
                raise e.cause from None
            raise

    def shards_for(self, n_prompts: int) -> int:
        return max(1, min(n_prompts, SHARDS_PER_WORKER * len(self.slots)))

    # ---- the queue ----
    def run(self, batches):
        """(tag, items) shards -> (tag, result) per prompt, as the actors finish them."""
        todo = deque((tag, list(items), 0) for tag, items in batches if items)
        events: queue.Queue = queue.Queue()
        stop = threading.Event()
        threads = [
            threading.Thread(target=self._serve, args=(i, todo, events, stop), daemon=True)
            for i in range(len(self.slots))
        ]
        for t in threads:
            t.start()
        idle = 0
        try:
            while idle < len(threads):
                kind, tag, value = events.get()
                if kind == "result":
                    yield tag, value
                elif kind == "idle":
                    idle += 1
                elif kind == "retry":
                    print(f"note: --ray: shard {tag} goes back to the queue ({value})", file=sys.stderr)
                elif kind == "error":
                    raise value
        finally:
            stop.set()
        if todo:  # every actor gone while shards remained (a failure already said why)
            raise HarnessError(f"--ray: shards {[t for t, _, _ in todo]} unfinished; continue with --resume")

    def _serve(self, i: int, todo: deque, events: queue.Queue, stop: threading.Event) -> None:
        """One actor's loop: take a shard, stream its results; on failure, requeue what is left and replace
        the actor."""
        try:
            while not stop.is_set():
                try:
                    tag, items, tries = todo.popleft()
                except IndexError:
                    return
                got: set = set()
                try:
                    for ref in self.slots[i].run.remote(items):
                        res = self.ray.get(ref)
                        got.add((res["workload"], res["prompt_id"]))
                        events.put(("result", tag, res))
                        if stop.is_set():
                            return
                except self.ray.exceptions.RayError as e:
                    if stop.is_set():  # the driver is closing the pool: nothing to retry for
                        return
                    rest = [x for x in items if (x[0], x[1]) not in got]
                    if not self._retry(i, tag, rest, tries, e, todo, events):
                        return
        finally:
            events.put(("idle", None, None))

    def _retry(self, i, tag, rest, tries, e, todo, events) -> bool:
        """Requeue a failed shard's unfinished prompts on a fresh actor; False (and an error event) when not."""
        if isinstance(e, self.ray.exceptions.RayTaskError) and isinstance(e.cause, InputError):
            events.put(("error", tag, e.cause))
            return False
        if tries + 1 >= MAX_TRIES:
            events.put(
                (
                    "error",
                    tag,
                    HarnessError(
                        f"--ray: shard {tag} failed {MAX_TRIES} times (last: {_one_line(e)}); "
                        "finished prompts are kept: continue with --resume"
                    ),
                )
            )
            return False
        todo.append((tag, rest, tries + 1))
        with self.lock:
            self.failures[self.ids[i]] = self.failures.get(self.ids[i], 0) + 1
            events.put(("retry", tag, f"worker {self.ids[i]}: {_one_line(e)}"))
            if self.spawned >= self.budget:
                events.put(("error", tag, HarnessError(f"--ray: too many workers lost (last: {_one_line(e)})")))
                return False
            old, self.slots[i] = self.slots[i], self._spawn()
        try:
            self.ray.kill(old)
        except Exception:
            pass  # already gone
        try:
            self.ids[i] = self._get(self.slots[i].load.remote(self.plan))["worker"]
        except Exception as e2:  # the replacement could not load the models either
            events.put(("error", tag, e2))
            return False
        return True

    # ---- after the sweep: on one actor ----
    def live(self, prompts, outputs, chosen, done, policies=None, workloads=(), timing=None):
        """The live decodes on one actor (the policies, made by the driver, travel pickled and learn there)."""
        for ref in self.slots[0].live.remote(prompts, outputs, chosen, done, policies, workloads, timing):
            yield self._get(ref)

    def policy_timing(self, prompts, outputs, chosen):
        return self._get(self.slots[0].policy_timing.remote(prompts, outputs, chosen))

    def time_verify(self, prefixes, k, n_drafts):
        return self._get(self.slots[0].time_verify.remote(prefixes, k, n_drafts))

    def calibrate(self, prompts, progress=None):
        return self._get(self.slots[0].calibrate.remote(prompts))

    def close(self) -> None:
        for a in getattr(self, "slots", []):
            try:
                self.ray.kill(a)
            except Exception:
                pass
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
