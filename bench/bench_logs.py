"""Loading speed and peak memory of `load_logs` on a simulated 1M-record, 4-drafter .jsonl.gz log.

Targets (issue 2): >= 100k records/s and < 2 GB peak RSS. Each measurement runs in a fresh
subprocess and reads its own peak RSS from /proc/self/status VmHWM (`ru_maxrss` would survive
the fork+exec and report the parent's peak, e.g. that of writing the log).
Side by side in the same run, two floors: decompression alone, and decompression + orjson
parse of every line (nothing kept); the ratios say what parsing, validation and the table
cost on this machine, whatever its load.

    python bench/bench_logs.py [--records 1000000]      # the log is cached in bench/out/
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
path, mode = {path!r}, {mode!r}
t0 = time.perf_counter()
if mode == "load":
    from bandit.logs import load_logs
    t = load_logs([path])
    n = t.n_records
elif mode == "gunzip":
    import zlib
    d, n = zlib.decompressobj(wbits=31), 0
    with open(path, "rb") as f:
        while raw := f.read(1 << 22):
            n += d.decompress(raw).count(b"\n")
elif mode == "parse":
    import gzip, orjson
    n = 0
    with gzip.open(path, "rb") as f:
        for line in f:
            orjson.loads(line); n += 1
dt = time.perf_counter() - t0
try:
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"records": n, "seconds": dt, "peak_rss_mb": hwm}}))
"""


def _measure(path: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path), mode=mode)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = ap.parse_args()
    from bandit.simulate import SimConfig, write_sim_run
    n_prompts = max(1, args.records // (4 * 500))
    cfg = SimConfig(n_prompts=n_prompts, out_len=500, seed=7)
    run = args.out / f"sim_{4 * n_prompts * 500}"
    path = run / "blocks_sim.jsonl.gz"
    if not path.exists():
        t0 = time.perf_counter()
        write_sim_run(cfg, run, compresslevel=1)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB gz) in {time.perf_counter() - t0:.1f} s")
    gunzip = _measure(path, "gunzip")
    parse = _measure(path, "parse")
    load = _measure(path, "load")
    for name, m in (("gunzip floor", gunzip), ("parse floor (gzip+orjson)", parse), ("load_logs", load)):
        print(f"{name:28s} {m['records']:>9d} records  {m['seconds']:7.2f} s  "
              f"{m['records'] / m['seconds'] / 1e3:8.1f} k records/s  peak RSS {m['peak_rss_mb']:7.0f} MB")
    rate = load["records"] / load["seconds"]
    print(f"time ratios: load_logs / parse floor {load['seconds'] / parse['seconds']:.2f}x, "
          f"parse floor / gunzip floor {parse['seconds'] / gunzip['seconds']:.2f}x")
    print(f"target >= 100k records/s: {rate / 1e5:.2f}x of target ({'met' if rate >= 1e5 else 'MISSED'}); "
          f"target < 2 GB peak: {load['peak_rss_mb']:.0f} MB ({'met' if load['peak_rss_mb'] < 2048 else 'MISSED'})")


if __name__ == "__main__":
    main()
