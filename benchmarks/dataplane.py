"""Benchmark (d): the data plane against what users would pick instead, and where its CPU goes.

For each workload (GeoNames, ``--live`` subscriptions, ``--mix`` of keywords:
``sparse`` is the default workload, ``dense`` gives ~26 matches per object at
100k live; see ``benchmarks/baselines.py``) it runs, on the same stream:

- the PostGIS reverse-matching baseline and the shapely STRtree matcher
  (``benchmarks.baselines``), objects/s after the subscriptions are loaded;
- skpub's local engine and its Spark engine on each ``--spark`` master
  (``local[1]``, ``local[2]``), through the ``skpub`` command as a user runs
  it, objects/s after the first micro-batch (the first one loads the
  subscriptions and, on Spark, pays the JVM's warm-up);

checks that every system found exactly the same matches, and prints two
tables: throughput with the ratios the issue sets targets for, and the CPU
seconds per stage of each skpub run (parse: parallel; sequencer: serial;
evaluators; sink), the serial fraction, the sequencer's CPU per object and
the speed-up bound it implies (Amdahl: 1 / serial fraction).

Run::

    .venv/bin/python -m benchmarks.dataplane [--live 10000 100000] [--mix sparse dense] \\
        [--spark 'local[1]' 'local[2]'] [--work bench-out/dataplane]

Needs PostgreSQL 15 with PostGIS 3 (``apt-get install postgresql-15-postgis-3``)
and ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.baselines import MIXES, make_workload, postgis_matches, skpub_matches, strtree_matches


@dataclass
class SkpubRun:
    """What one ``skpub run`` reported."""

    name: str
    matches: set = field(repr=False)
    steady: float
    stages: dict[str, float]
    serial: float
    sequencer_us: float


_STEADY = re.compile(r"; ([\d,]+)/s after the first batch\)")
_STAGES = re.compile(r"stage cpu\s+(.*)")
_STAGE = re.compile(r"(\w+) ([\d.]+) s")
_SERIAL = re.compile(r"serial\s+([\d.]+)% of stage CPU, ([\d.]+) us per object")


def run_skpub(name: str, stream: Path, vocabulary: Path, work: Path, engine: list[str]) -> SkpubRun:
    """Run ``skpub run`` with ``engine`` arguments; return its matches and reported figures."""
    matches, text = skpub_matches(stream, vocabulary, work, *engine)
    stages = {name: float(value) for name, value in _STAGE.findall(_STAGES.search(text).group(1))}
    serial, per_object = map(float, _SERIAL.search(text).groups())
    steady = float(_STEADY.search(text).group(1).replace(",", ""))
    return SkpubRun(name, matches, steady, stages, serial, per_object)


def main(argv: list[str] | None = None) -> None:
    """Run every system on every workload and print the two tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--mix", nargs="+", choices=sorted(MIXES), default=["sparse", "dense"])
    parser.add_argument("--spark", nargs="*", default=["local[1]", "local[2]"], help="Spark masters to run")
    parser.add_argument("--objects", type=int, default=None, help="cut the workloads to this many objects")
    parser.add_argument("--work", default="bench-out/dataplane")
    args = parser.parse_args(argv)
    root = Path(args.work)
    throughput, stages = [], []
    for mix in args.mix:
        for live in args.live:
            name = f"{mix}-{live}" + (f"-{args.objects}" if args.objects else "")
            stream, vocabulary = make_workload(root / f"workload-{name}", live, MIXES[mix], args.objects)
            print(f"[{name}] PostGIS", file=sys.stderr, flush=True)
            pg, pg_rate, n = postgis_matches(stream, live)
            print(f"[{name}] STRtree", file=sys.stderr, flush=True)
            tree, tree_rate, _ = strtree_matches(stream, live)
            runs = []
            for label, engine in [("local", ["--engine", "local"])] + [
                (f"spark {m}", ["--engine", "spark", "--master", m]) for m in args.spark
            ]:
                print(f"[{name}] skpub {label}", file=sys.stderr, flush=True)
                runs.append(run_skpub(label, stream, vocabulary, root, engine))
            same = all(r.matches == pg for r in runs) and tree == pg
            local = runs[0]
            spark2 = next((r for r in runs if r.name == "spark local[2]"), None)
            throughput.append(
                f"| {mix} | {live:,} | {n:,} | {len(pg) / max(n, 1):.2f} | {pg_rate:,.0f} | {tree_rate:,.0f} "
                + "".join(f"| {r.steady:,.0f} " for r in runs)
                + f"| {local.steady / pg_rate:.2f}x | {local.steady / tree_rate:.2f}x "
                + (f"| {spark2.steady / pg_rate:.2f}x " if spark2 else "| - ")
                + f"| {'yes' if same else 'NO'} |"
            )
            for r in runs:
                s = r.stages
                bound = 100 / r.serial if r.serial else float("inf")
                stages.append(
                    f"| {mix} | {live:,} | {r.name} | {s['parse']:.2f} | {s['sequencer']:.2f} | {s['evaluators']:.2f} "
                    f"| {s['sink']:.2f} | {r.serial:.1f}% | {r.sequencer_us:.2f} | {bound:.1f}x |"
                )
            del pg, tree, runs
    names = ["local", *(f"spark {m}" for m in args.spark)]
    print("\n| mix | live | objects | matches/object | PostGIS | STRtree | " + " | ".join(f"skpub {n}" for n in names)
          + " | local / PostGIS | local / STRtree | spark local[2] / PostGIS | same matches |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|---|")
    print("\n".join(throughput))
    print("\n| mix | live | skpub | parse s | sequencer s | evaluators s | sink s | serial | sequencer us/object "
          "| speed-up bound |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(stages))


if __name__ == "__main__":
    main()
