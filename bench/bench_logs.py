"""Loading speed and peak memory of `load_logs` on a simulated 1M-record, 4-drafter .jsonl.gz log.

Targets (issue 2): >= 100k records/s and < 2 GB peak RSS. Each measurement runs in a fresh
subprocess and reads its own peak RSS from /proc/self/status VmHWM (`ru_maxrss` would survive
the fork+exec and report the parent's peak, e.g. that of writing the log).
Side by side in the same run, floors: decompression alone, decompression + orjson parse of
every line (nothing kept), decompression + pyarrow's parse into columns as `bandit/fastload.py`
runs it (no checks, no arrays; skipped without pyarrow), and decompression + the compiled
parser of bandit/_colparse.c as fastload runs it (its own checks, no arrays; skipped when it is
not built); the ratios say what parsing, validation and the table cost on this machine,
whatever its load. It also says which path `load_logs` read the log on.

    python bench/bench_logs.py [--records 1000000] [--pyarrow] [--orjson]   # the log is cached in bench/out/
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
path_ran = None
if mode.startswith("load"):
    from bandit import logs, fastload
    if mode == "load-orjson":
        logs._fastload = None
        path_ran = "orjson/exact path (compiled readers switched off)"
    else:
        if mode == "load-pyarrow":
            fastload._colparse = None
        real = fastload.read_file
        def spy(*a, **k):  # which path read the file
            global path_ran
            out = real(*a, **k)
            have = [n for n, m in (("compiled parser", fastload._colparse), ("pyarrow", fastload.pa)) if m is not None]
            path_ran = (f"{{out[3]}} fast path ({{'bandit/_colparse.c' if out[3] == 'compiled' else 'pyarrow'}})"
                        if out is not None else f"orjson/exact path (refused by: {{', '.join(have) or 'none installed'}})")
            return out
        fastload.read_file = spy
    t = logs.load_logs([path])
    n = t.n_records
elif mode == "arrow":  # fastload's pipeline (decompressing thread, pyarrow parse) without checks or arrays
    import queue, threading, pyarrow as pa, pyarrow.json as pj
    from pathlib import Path
    from bandit import fastload
    q, stop = queue.Queue(maxsize=2), threading.Event()
    threading.Thread(target=fastload._produce, args=(Path(path), q, stop), daemon=True).start()
    ro, n = pj.ReadOptions(use_threads=True, block_size=fastload._BLOCK), 0
    while (item := q.get())[0] not in ("end", "unfit"):
        n += pj.read_json(pa.BufferReader(item[0]), read_options=ro).num_rows
elif mode == "compiled":  # fastload's pipeline (decompressing thread, compiled parser) without numpy arrays
    import json as _json, queue, threading
    from pathlib import Path
    from bandit import fastload, _colparse
    q, stop = queue.Queue(maxsize=2), threading.Event()
    threading.Thread(target=fastload._produce_pieces, args=(Path(path), q, stop), daemon=True).start()
    parser, n = None, 0
    while (item := q.get())[0] == "piece":
        if parser is None:
            names = sorted(_json.loads(item[1][:item[1].index(b"\n")])["drafts"])
            parser = _colparse.Parser([x.encode() for x in names], [True] * len(names))
        assert parser.feed(item[1]), parser.why
        n += parser.take()[0]
    assert parser.finish()
    n += parser.take()[0]
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
print(json.dumps({{"records": n, "seconds": dt, "peak_rss_mb": hwm, "path": path_ran}}))
"""


def _measure(path: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path), mode=mode)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--pyarrow", action="store_true", help="also time load_logs with the compiled parser off")
    ap.add_argument("--orjson", action="store_true", help="also time load_logs with both compiled readers off")
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
    rows = [("gunzip floor", gunzip), ("parse floor (gzip+orjson)", parse)]
    from bandit import fastload
    arrow = _measure(path, "arrow") if fastload.pa is not None else None
    if arrow:
        rows.append(("parse floor (gzip+pyarrow)", arrow))
    compiled = _measure(path, "compiled") if fastload._colparse is not None else None
    if compiled:
        rows.append(("parse floor (gzip+compiled)", compiled))
    load = _measure(path, "load")
    rows.append(("load_logs", load))
    if args.pyarrow:
        rows.append(("load_logs, compiled off", _measure(path, "load-pyarrow")))
    if args.orjson:
        rows.append(("load_logs, both off", _measure(path, "load-orjson")))
    for name, m in rows:
        print(f"{name:28s} {m['records']:>9d} records  {m['seconds']:7.2f} s  "
              f"{m['records'] / m['seconds'] / 1e3:8.1f} k records/s  peak RSS {m['peak_rss_mb']:7.0f} MB")
    rate = load["records"] / load["seconds"]
    print(f"load_logs read the log on: {load['path']}")
    print(f"time ratios: load_logs / gunzip floor {load['seconds'] / gunzip['seconds']:.2f}x "
          f"(100k records/s is {gunzip['records'] / gunzip['seconds'] / 1e5:.2f}x at this run's gunzip speed), "
          f"load_logs / parse floor {load['seconds'] / parse['seconds']:.2f}x, "
          f"parse floor / gunzip floor {parse['seconds'] / gunzip['seconds']:.2f}x"
          + (f", pyarrow parse floor / gunzip floor {arrow['seconds'] / gunzip['seconds']:.2f}x" if arrow else "")
          + (f", compiled parse floor / gunzip floor {compiled['seconds'] / gunzip['seconds']:.2f}x" if compiled else ""))
    print(f"target >= 100k records/s: {rate / 1e5:.2f}x of target ({'met' if rate >= 1e5 else 'MISSED'}); "
          f"target < 2 GB peak: {load['peak_rss_mb']:.0f} MB ({'met' if load['peak_rss_mb'] < 2048 else 'MISSED'})")


if __name__ == "__main__":
    main()
