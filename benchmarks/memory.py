"""Peak memory against stream length: the object-id horizon bounds the routing unit's memory.

SEMANTICS section 1: object ids are unique only among the last
``object_id_horizon`` accepted objects, so an engine's memory must not grow
with the number of objects streamed. This runs ``skpub run`` on streams of
increasing length (all object ids unique, a fixed set of range
subscriptions) and reports each run's peak resident memory, sampled every
0.2 s from /proc over the whole process tree (for Spark: the driver, its JVM
and the Python workers): the peak of the largest single process and the peak
of the tree's sum.

Usage::

    python -m benchmarks.memory --engine local --objects 200000 2000000 --horizon 100000
    python -m benchmarks.memory --engine spark --objects 200000 2000000 --horizon 100000

Prints one line per run and the ratio of the largest to the smallest peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TERMS = [f"t{i}" for i in range(2000)]


def write_stream(path: Path, objects: int, subscriptions: int = 1000, seed: int = 1) -> None:
    """Write ``subscriptions`` range subscriptions, then ``objects`` objects with unique ids."""
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="utf-8") as fh:
        for s in range(subscriptions):
            x, y = rng.uniform(-170, 160), rng.uniform(-80, 70)
            w, h = rng.uniform(1, 20, size=2)
            kw = [TERMS[i] for i in rng.choice(len(TERMS), size=int(rng.integers(1, 3)), replace=False)]
            rec = {"type": "subscribe", "id": f"s{s}", "kind": "range", "rect": [x, y, x + w, y + h], "keywords": kw}
            fh.write(json.dumps(rec) + "\n")
        chunk = 100_000
        for start in range(0, objects, chunk):
            n = min(chunk, objects - start)
            xs, ys = rng.uniform(-180, 180, n), rng.uniform(-90, 90, n)
            words = rng.integers(0, len(TERMS), size=(n, 3))
            fh.writelines(
                f'{{"type":"object","id":"o{start + i}","x":{xs[i]:.5f},"y":{ys[i]:.5f},'
                f'"text":"{TERMS[words[i, 0]]} {TERMS[words[i, 1]]} {TERMS[words[i, 2]]}"}}\n'
                for i in range(n)
            )


def _tree_rss(pid: int) -> tuple[int, int]:
    """RSS in bytes of ``pid`` and its descendants (from /proc): (sum, largest single process)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    total, largest, stack = 0, 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        largest = max(largest, rss.get(p, 0))
        stack.extend(children.get(p, []))
    return total, largest


def measure(engine: str, stream: Path, config: Path, out: Path) -> tuple[float, int, int]:
    """Run skpub once; return (seconds, peak RSS of the largest process, peak summed RSS of the tree), bytes."""
    cmd = [sys.executable, "-m", "skpub.app.cli", "run", "--engine", engine, "--input", str(stream)]
    cmd += ["--output", str(out), "--config", str(config), "--quiet"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            total, largest = _tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], largest), max(peak[1], total)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    if code != 0:
        raise SystemExit(f"skpub run failed with exit code {code}")
    return time.perf_counter() - start, peak[0], peak[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("local", "spark"), default="local")
    parser.add_argument("--objects", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--horizon", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skpub-memory-") as tmp:
        root = Path(tmp)
        config = root / "deployment.json"
        config.write_text(json.dumps({"object_id_horizon": args.horizon, "batch_size": args.batch_size}))
        peaks = []
        for n in args.objects:
            stream = root / f"stream-{n}.jsonl"
            write_stream(stream, n)
            seconds, maxrss, tree = measure(args.engine, stream, config, root / f"out-{n}")
            peaks.append((maxrss, tree))
            print(
                f"{args.engine:5s} objects={n:>9,} horizon={args.horizon:,}: {seconds:6.1f} s, "
                f"largest process {maxrss / 2**20:7.1f} MiB, "
                f"peak RSS of the process tree {tree / 2**20:7.1f} MiB",
                flush=True,
            )
            stream.unlink()
        first, last = peaks[0], peaks[-1]
        print(
            f"largest / smallest stream: largest process {last[0] / 2**20 - first[0] / 2**20:+.1f} MiB "
            f"({last[0] / first[0]:.2f}x), process tree {last[1] / 2**20 - first[1] / 2**20:+.1f} MiB "
            f"({last[1] / max(first[1], 1):.2f}x)"
        )


if __name__ == "__main__":
    main()
