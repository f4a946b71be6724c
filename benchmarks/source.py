"""Benchmark (h): the Spark engine's input, read in place by skpub's source against staging a copy first.

Writes the GeoNames workload (``--objects``), then for each checkout given
(this one, and with ``--baseline DIR`` an older one, e.g. a ``git worktree``
of the last commit that staged the input) runs ``skpub run --engine spark``
on it in a fresh process, one after the other, and reports:

- wall seconds of the whole command, and the processing seconds its summary
  reports (``objects ... over X s``): the difference is the start-up before
  the first micro-batch (Spark's start, the checkpoint's set-up, and with
  staging the copy of the input);
- bytes in the checkpoint at the end (staging keeps the copy there);
- the driver's planning cost of the source alone (``cut`` and ``split`` over
  the whole input, one core): seconds and MB/s.

Deliveries of every run are compared: they must be the same.

With ``--copies N`` the stream is written N times over (ids repeat, so the
copies are mostly ``duplicate_id`` dead letters: parse work without
matching), for inputs past the GeoNames places.

Run: ``python -m benchmarks.source [--objects N] [--copies N] [--baseline DIR]``
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skpub.kernel.slices import cut, file_sizes, split
from skpub.sims.geonames import WorkloadSpec, write_workload

PARTS = 2
BATCH = 100_000


def planning(path: Path) -> tuple[float, int]:
    """Return (seconds, batches) to plan every micro-batch of ``path`` as the source does."""
    files, sizes = [path], file_sizes([path])
    start, batches, began = (0, 0), 0, time.perf_counter()
    while (end := cut(files, sizes, start, BATCH, PARTS * (256 << 20))) != start:
        split(files, sizes, start, end, PARTS)
        start, batches = end, batches + 1
    return time.perf_counter() - began, batches


def run(tree: Path, stream: Path, config: Path, out: Path) -> dict:
    """Run ``skpub run --engine spark`` from checkout ``tree``; return its figures."""
    code = "import sys; from skpub.app.cli import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "run", "--engine", "spark", "--input", str(stream), "--output", str(out)]
    began = time.perf_counter()
    command += ["--config", str(config), "--vocabulary", str(config.parent / "vocabulary.json")]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - began
    processing = float(re.search(r"objects/s over ([\d.]+) s", done.stdout).group(1))
    checkpoint = sum(p.stat().st_size for p in (out / "_checkpoint").rglob("*") if p.is_file())
    lines = sorted(line for p in (out / "deliveries").glob("*.jsonl") for line in p.read_bytes().splitlines())
    digest = hashlib.sha256(b"\n".join(lines))
    return {"wall": wall, "processing": processing, "checkpoint": checkpoint, "deliveries": digest.hexdigest()}


def main() -> None:
    """Print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare with (run from there)")
    parser.add_argument("--copies", type=int, default=1, help="the stream this many times over (ids repeat)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skpub-source-") as tmp:
        work = Path(tmp)
        write_workload(WorkloadSpec(objects=args.objects), work / "w")
        stream = work / "w" / "stream.jsonl"
        if args.copies > 1:
            data = stream.read_bytes()
            stream = work / "w" / "copies.jsonl"
            with stream.open("wb") as fh:
                for _ in range(args.copies):
                    fh.write(data)
        size = stream.stat().st_size
        seconds, batches = planning(stream)
        print(f"input: {size / 1e6:.0f} MB, {batches} micro-batches of {BATCH} records")
        print(f"source planning (cut + split, driver, one core): {seconds:.2f} s, {size / 1e6 / seconds:.0f} MB/s")
        trees = {"read in place": Path(__file__).resolve().parents[1]}
        if args.baseline is not None:
            trees["staged (baseline)"] = args.baseline.resolve()
        results = {}
        for name, tree in trees.items():
            results[name] = run(tree, stream, work / "w" / "deployment.json", work / f"out-{len(results)}")
        print(f"{'input':<20}{'wall s':>9}{'processing s':>14}{'start-up s':>12}{'checkpoint MB':>15}")
        for name, r in results.items():
            startup = r["wall"] - r["processing"]
            print(f"{name:<20}{r['wall']:>9.1f}{r['processing']:>14.1f}{startup:>12.1f}{r['checkpoint'] / 1e6:>15.1f}")
        if len(results) == 2:
            new, old = results.values()
            print(f"wall, in place / staged: {new['wall'] / old['wall']:.3f}x")
        digests = {r["deliveries"] for r in results.values()}
        print("deliveries: " + ("the same" if len(digests) == 1 else "DIFFERENT"))


if __name__ == "__main__":
    main()
