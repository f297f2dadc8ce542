"""Campaign time with 1 and 2 Ray workers, side by side in one run (a measurement, not a target).

    python bench/bench_sweep.py [--prompts 24] [--max-new-tokens 48] [--k 4] [--workers 1,2]

The same dense campaign (tiny random-init target, hidden 128 x 4 layers; drafters ngram, suffix and a
draft model) runs once in one process and then on one local Ray with each worker count. Printed per
row: the wall time of the whole sweep (Ray workers' model loading included), the sweep phase alone (the
busiest worker's summed compute time, from the manifest's throughput), and the campaign's records/s over
that phase; then the ratio against the first worker count. Rows are compared only when every run logged
the same records (checked: equal work); otherwise the row says `refused`.

Expect little on a 2-core machine: two workers share the two cores with Ray's own processes and the
driver, so the ratio says more about the machine than about the engine. On a host with a GPU per worker
(or many cores) the sweep phase should scale with the worker count, and model loading is paid once per
worker.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python bench/bench_sweep.py` from anywhere: the imports below are ours

import sweep
from bandit.logs.reader import iter_records
from harness.models.tiny import make_model, make_tokenizer, save_model, write_workload_file


def _models(root: Path) -> tuple[Path, Path]:
    tok = make_tokenizer()
    target = save_model(make_model("llama", len(tok), hidden=128, layers=4, seed=0), tok, root / "target")
    draft = save_model(make_model("llama", len(tok), hidden=32, layers=1, seed=1), tok, root / "draft")
    return target, draft


def _prompts(n: int) -> list[tuple[str, str, str]]:
    wl = ("code", "copy", "chat")
    return [
        (wl[i % 3], f"b{i}", f"def f{i}(x):\n    return x * {i} + {i % 7}\n# {'abc ' * (i % 5)}\n") for i in range(n)
    ]


def _records(d: Path) -> list:
    out = [r for f in sorted(d.glob("blocks_*.jsonl")) for _, r in iter_records(f)]
    return sorted((r["workload"], r["prompt_id"], r["pos"], json.dumps(r["drafts"], sort_keys=True)) for r in out)


def _row(name: str, out: Path, wall: float) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    workers = m["throughput"]["workers"].values()
    busy = max(w["seconds"] for w in workers)
    records = sum(w["records"] for w in workers)
    return {"name": name, "wall": wall, "busy": busy, "rate": records / busy, "workers": list(workers), "out": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--workers", default="1,2", help="comma-separated Ray worker counts")
    a = ap.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target, draft = _models(root)
        wl = write_workload_file(root / "wl.jsonl", _prompts(a.prompts))
        kw = dict(target=str(target), drafter=["ngram=ngram", "suffix=suffix", f"draft=draft:path={draft}"])
        kw.update(workload_file=str(wl), k=a.k, max_new_tokens=a.max_new_tokens, quiet=True)
        rows = []
        t0 = time.perf_counter()
        sweep.run_sweep(**kw, out=str(root / "local"))
        rows.append(_row("one process", root / "local", time.perf_counter() - t0))
        ray.init(include_dashboard=False, log_to_driver=False)  # one local Ray for every row: its start is not timed
        try:
            for n in (int(x) for x in a.workers.split(",")):
                out = root / f"ray{n}"
                t0 = time.perf_counter()
                sweep.run_sweep(**kw, out=str(out), ray="local", workers=n)
                rows.append(_row(f"ray, {n} worker{'s' if n > 1 else ''}", out, time.perf_counter() - t0))
        finally:
            ray.shutdown()
        ref = _records(rows[0]["out"])
        print(f"{a.prompts} prompts x {a.max_new_tokens} tokens, k={a.k}, {len(ref)} records; cpu cores: {_cores()}")
        print(
            f"{'':16} {'wall s':>8} {'sweep s':>8} {'records/s':>10} {'speedup vs the first ray row (wall, sweep)':>44}"
        )
        base = next((r for r in rows if r["name"].startswith("ray")), None)
        for r in rows:
            if _records(r["out"]) != ref:
                print(f"{r['name']:16} refused: its records differ from the one-process run's")
                continue
            ray_row = base is not None and r["name"].startswith("ray")
            ratio = f"{base['wall'] / r['wall']:.2f}x, {base['busy'] / r['busy']:.2f}x" if ray_row else ""
            print(f"{r['name']:16} {r['wall']:8.1f} {r['busy']:8.2f} {r['rate']:10.0f} {ratio:>44}")
            for w in r["workers"] if len(r["workers"]) > 1 else []:
                print(
                    f"{'':18}a worker: {w['prompts']} prompts, {w['seconds']:.2f} s, {w['records_per_s']:.0f} records/s"
                )
        print("wall: the whole sweep (Ray workers' model loading included); sweep: the busiest worker's compute time")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
