"""Loading speed and peak memory of `bandit.logs.reader.load_logs` on a simulated 1M-record, 4-drafter .jsonl.gz log.

Each measurement runs in a fresh subprocess that reads its own peak RSS from /proc/self/status
VmHWM (`ru_maxrss` would survive the fork+exec and report the parent's peak). Side by side:

  gunzip floor        decompression alone, nothing parsed: what no reader of the log can beat
  first load          no cached copy yet: pyarrow's reader, its checks, the table, the Parquet cache written
  cached load         the same log again: its Parquet copy read and checked instead of parsing
  pyarrow, no cache   the first load's work without writing the cache (SPECBANDIT_CACHE=off)
  exact path          the standard library's json and the per-record checks alone (pyarrow's reader off)

and their ratios, and whether every load gave the same table (a digest of its arrays). With
--campaign-10m it packs the log (`bandit.logs.reader.pack`), writes ten copies of the packed file as one
campaign of 10M records (distinct prompts: workload names prefixed s0-..s9-) and loads all of it
from Parquet, against the target of 4 GB peak RSS. The log, its cache and the campaign are kept
in bench/out/.

    python bench/bench_logs.py [--records 1000000] [--campaign-10m] [--no-exact]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, sys.argv[1])
mode, path = sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
out = {"path": None, "digest": None}
if mode == "gunzip":
    import zlib
    d, n = zlib.decompressobj(wbits=31), 0
    with open(path, "rb") as f:
        while raw := f.read(1 << 22):
            n += d.decompress(raw).count(b"\n")
else:
    from bandit import logs
    from bandit.table import ROW_FIELDS
    seen = []  # what parsed the log: pyarrow's reader (or "refused"), the exact path; nothing: a Parquet file
    arrow, exact = logs.read_arrow, logs.read_exact
    def spy_arrow(p):
        cols = arrow(p) if mode != "exact" else None
        seen.append("pyarrow" if cols is not None else "refused" if mode != "exact" else "pyarrow off")
        return cols
    logs.read_arrow = spy_arrow
    logs.read_exact = lambda p, dr: seen.append("exact") or exact(p, dr)
    t = logs.load_logs([path])
    n = t.n_records
seconds = time.perf_counter() - t0
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) / 1024
if mode != "gunzip":  # after the peak was read: a digest of the table's arrays, hashed in place
    h = hashlib.sha256()
    for f in ROW_FIELDS:
        h.update(memoryview(getattr(t, f)).cast("B"))
    out.update(path=" then ".join(seen) or "parquet", digest=h.hexdigest()[:16], pandas="pandas" in sys.modules)
print(json.dumps({"records": n, "seconds": seconds, "peak_rss_mb": hwm, **out}))
"""


def _measure(path: Path, mode: str, cache: str) -> dict:
    env = {**os.environ, "SPECBANDIT_CACHE": cache}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), mode, str(path)], capture_output=True, text=True, env=env
    )
    if out.returncode:
        sys.exit(f"{mode}: child failed\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(name: str, m: dict) -> str:
    rate = m["records"] / m["seconds"] / 1e3
    via = f"  [{m['path']}]" if m["path"] else ""
    return (
        f"{name:22s} {m['records']:>10d} records {m['seconds']:8.2f} s {rate:8.1f} k records/s"
        f"  peak RSS {m['peak_rss_mb']:7.0f} MB{via}"
    )


def _log(records: int, out: Path) -> Path:
    from bandit.sim.simulate import SimConfig, write_sim_run

    n_prompts = max(1, records // (4 * 500))
    run = out / f"sim_{4 * n_prompts * 500}"
    path = run / "blocks_sim.jsonl.gz"
    if not path.exists():
        t0 = time.perf_counter()
        write_sim_run(SimConfig(n_prompts=n_prompts, out_len=500, seed=7), run, compresslevel=1)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB gz) in {time.perf_counter() - t0:.1f} s")
    return path


def _campaign(log: Path, out: Path, shards: int = 10) -> Path:
    """`shards` copies of the packed log as one campaign: workload W of copy k renamed sK-W (distinct prompts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from bandit.logs import columnar
    from bandit.logs.reader import pack

    packed, camp = out / f"packed_{log.parent.name}", out / f"campaign_{shards}x_{log.parent.name}"
    if not (packed / "blocks_sim.parquet").exists():
        pack([log], out=packed)
    if len(list(camp.glob("blocks_*.parquet"))) == shards:
        return camp
    camp.mkdir(parents=True, exist_ok=True)
    shutil.copy(packed / "manifest.json", camp / "manifest.json")
    t = pq.read_table(packed / "blocks_sim.parquet")
    w = t.column("workload").combine_chunks().dictionary_encode()
    for k in range(shards):
        names = pa.array([f"s{k}-{x}" for x in w.dictionary.to_pylist()], pa.string())
        col = pa.DictionaryArray.from_arrays(w.indices, names).cast(pa.string())
        shard = t.set_column(t.schema.get_field_index("workload"), "workload", col)
        columnar.write_parquet(camp / f"blocks_s{k}.parquet", shard)
    print(f"wrote {camp}: {shards} packed shards of {t.num_rows} records")
    return camp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    ap.add_argument("--campaign-10m", action="store_true", help="also load ten packed copies (10M records)")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact path (the slowest measurement)")
    args = ap.parse_args()
    path = _log(args.records, args.out)
    cache = str(args.out / "cache")  # the fallback directory; the copy goes beside the log
    for old in path.parent.glob(f".{path.name}.*.parquet"):
        old.unlink()
    rows = [
        ("gunzip floor", _measure(path, "gunzip", "off")),
        ("first load", _measure(path, "load", cache)),
        ("cached load", _measure(path, "load", cache)),
        ("pyarrow, no cache", _measure(path, "load", "off")),
    ]
    if not args.no_exact:
        rows.append(("exact path", _measure(path, "exact", "off")))
    for name, m in rows:
        print(_row(name, m))
    m = dict(rows)
    g, first, hit = m["gunzip floor"]["seconds"], m["first load"]["seconds"], m["cached load"]["seconds"]
    ratios = [
        f"first load / gunzip floor {first / g:.2f}x",
        f"cached load / gunzip floor {hit / g:.2f}x",
        f"first / cached {first / hit:.1f}x",
        f"cache write {first - m['pyarrow, no cache']['seconds']:+.2f} s on the first load",
    ]
    if "exact path" in m:
        ratios.append(f"exact path / first load {m['exact path']['seconds'] / first:.1f}x")
    print("ratios: " + ", ".join(ratios))
    digests = {r["digest"] for _, r in rows if r["digest"]}
    print(
        f"same table on every load: {'yes' if len(digests) == 1 else 'NO: ' + ', '.join(sorted(digests))}; "
        f"pandas imported by a load: {any(r.get('pandas') for _, r in rows)}"
    )
    if args.campaign_10m:
        camp = _campaign(path, args.out)
        c = _measure(camp, "load", "off")
        print(_row("10 packed shards", c))
        ok = c["peak_rss_mb"] < 4096
        print(
            f"target < 4 GB peak RSS loading {c['records'] / 1e6:.0f}M records from Parquet: "
            f"{c['peak_rss_mb']:.0f} MB ({'met' if ok else 'MISSED'})"
        )


if __name__ == "__main__":
    main()
