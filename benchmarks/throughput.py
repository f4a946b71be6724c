"""Benchmark (b): end-to-end throughput on the GeoNames default workload.

For 10k and 100k live subscriptions it runs the local engine and the Spark
engine (``local[2]``, micro-batches of 100k records) with the A-Grid and the
uniform router, and checks that every run delivers exactly the same matches.
It reports objects/s (processing, setup excluded), per-evaluator CPU time
max/mean, and the simulated parallel time ``sum over batches of max
evaluator CPU + routing`` (DESIGN "Measuring load honestly").

It also measures evaluator matching alone: every GeoNames object matched
against one GI^2 index holding the live subscriptions at the end of the
stream, on one core.

Run: python -m benchmarks.throughput [--live 10000 100000] [--engines local spark]
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from skpub.app.engines.local import run_local
from skpub.app.summary import RunObserver, RunSummary
from skpub.evaluators.gi2 import GI2Index, ObjectBatch
from skpub.kernel.config import Deployment
from skpub.kernel.grid import FineGrid
from skpub.kernel.inputs import iter_lines
from skpub.kernel.load import imbalance
from skpub.kernel.parts import read_stream
from skpub.kernel.records import ObjectRecord, RangeSubscription, Unsubscribe, parse_line
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.sims.geonames import WorkloadSpec, write_workload


def matching_rate(stream: Path, deployment: Deployment) -> tuple[float, int, int]:
    """Return (objects/s, objects, live subscriptions) of GI^2 matching on one core."""
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    grid = FineGrid(deployment.space, deployment.grid_size)
    index = GI2Index(deployment.index_block, vocabulary)
    objects, subscribes, unsubscribes = [], [], []
    for pos, line in enumerate(iter_lines(stream)):
        record = parse_line(line, pos, deployment.space, deployment.max_record_bytes)
        if isinstance(record, RangeSubscription):
            subscribes.append(record)
        elif isinstance(record, Unsubscribe):
            unsubscribes.append(record)
        elif isinstance(record, ObjectRecord):
            objects.append(record)
    # all at once, then the unsubscribes: ids are never reused, and liveness goes by position
    index.insert_many(subscribes, [grid.cell_box(sub.rect) for sub in subscribes])
    for record in unsubscribes:
        index.delete(record.id, record.pos)
    cells = [grid.cell_of(o.x, o.y) for o in objects]
    batch = ObjectBatch(
        np.array([o.pos for o in objects], dtype=np.int64),
        np.array([o.x for o in objects]),
        np.array([o.y for o in objects]),
        np.array([c[0] for c in cells], dtype=np.int64),
        np.array([c[1] for c in cells], dtype=np.int64),
        pa.array([list(o.terms) for o in objects], pa.list_(pa.string())),
    )
    tune_gc()
    start = time.thread_time()
    index.match_many(batch)
    return len(objects) / (time.thread_time() - start), len(objects), len(index)


def simulated_parallel_seconds(out: Path, summary: RunSummary) -> float:
    per_batch: dict[int, float] = defaultdict(float)
    for row in read_stream(out, "statistics"):
        per_batch[row["batch"]] = max(per_batch[row["batch"]], row["cpu_seconds"])
    return sum(per_batch.values()) + summary.routing_seconds


def run_one(engine: str, router: str, stream: Path, deployment: Deployment, root: Path) -> tuple[RunSummary, Path]:
    dep = deployment.replace(router=router)
    out = root / f"{engine}-{router}"
    shutil.rmtree(out, ignore_errors=True)
    observer = RunObserver(RunSummary(engine, router, dep.evaluators), stream=None)
    if engine == "local":
        return run_local(stream, out, dep, observer), out
    from skpub.app.engines.spark import run_spark

    return run_spark(stream, out, dep, observer), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--engines", nargs="+", default=["local", "spark"])
    parser.add_argument("--evaluators", type=int, default=8)
    parser.add_argument("--workdir", default="bench-out")
    args = parser.parse_args()
    root = Path(args.workdir)
    print("| live subs | engine | router | objects/s | after 1st batch | wall s | deliveries | eval CPU max/mean s | "
          "balance | simulated parallel s | uniform / A-Grid max eval CPU |")  # fmt: skip
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rates = []
    for live in args.live:
        stream, vocabulary = write_workload(
            WorkloadSpec(live=live, topk_fraction=0, knn_fraction=0, window=0), root / f"workload-{live}"
        )
        dep = Deployment(evaluators=args.evaluators, vocabulary=str(vocabulary))
        rates.append((live, *matching_rate(stream, dep)))
        deliveries = set()
        for engine in args.engines:
            parallel, max_cpu = {}, {}
            for router in ("agrid", "uniform"):
                summary, out = run_one(engine, router, stream, dep, root / f"run-{live}")
                deliveries.add(summary.deliveries)
                cpu = summary.evaluator_cpu
                parallel[router] = simulated_parallel_seconds(out, summary)
                max_cpu[router] = max(cpu)
                ratio = f"{max_cpu['uniform'] / max_cpu['agrid']:.2f}" if router == "uniform" else ""
                print(
                    f"| {live} | {engine} | {router} | {summary.objects_per_second:,.0f} "
                    f"| {summary.steady_objects_per_second:,.0f} | {summary.seconds:.1f} "
                    f"| {summary.deliveries} | {max(cpu):.2f} / {sum(cpu) / len(cpu):.2f} "
                    f"| {imbalance(cpu):.2f} | {parallel[router]:.2f} | {ratio} |",
                    flush=True,
                )
        assert len(deliveries) == 1, f"runs disagree on deliveries: {deliveries}"
    print("\n| live subs (end of stream) | objects matched | GI^2 matching objects/s on one core |")
    print("|---:|---:|---:|")
    for live, rate, n, held in rates:
        print(f"| {held} (target {live}) | {n} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
