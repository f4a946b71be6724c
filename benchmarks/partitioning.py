"""Benchmark (j): PS2Stream Figures 6-7 on GeoNames Q1, Q2, Q3, and grid^t's routing cost (docs/benchmarks.md (j)).

Part ``figures``: the shipped scenarios ``q1``, ``q2`` and ``q3`` (``sims/scenarios/``)
through the embedded engine with every router (kdt, kdtree, text, agrid,
uniform), 8 evaluators, balancer off (the initial partitionings compared, as
in Figure 7): simulated throughput (objects per simulated parallel second,
:func:`skpub.app.summary.parallel_seconds`), total workload (PS2Stream's
objective: every evaluator's cost, replication included, cost units) and
the figures behind them, median of ``--repeat`` runs (the runs are
identical but for CPU timing; the repeats are rounds over every router,
each round starting from the next router, so that the machine's slower
minutes fall on every router alike). ``--routing-units`` spreads the
parse stage over that many routing units, as PS2Stream's experiments ran
4 dispatchers (section VI); the sequencer stays serial. Then the targets: on Q3 kdt at least 1.3x the
better of kdtree and text and the least total workload; on Q1 within 10% of
kdtree, on Q2 within 10% of text.

Part ``routing``: the routing unit's cost per object with every cell
text-partitioned (``--router text``) at ``--live`` live range subscriptions:
the sequencer's CPU per object (grid^t lookups against the textual
summaries) over the micro-batches of objects alone, against the same stream
routed by space (A-Grid) and by the kd^t-tree.

Run: python -m benchmarks.partitioning [--parts figures routing] [--repeat 3] [--objects N]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from skpub.app.engines.local import LocalPipeline
from skpub.app.simulate import RunResult, Strategy, count_outputs, deployment_for, load_scenario, override, run_strategy
from skpub.kernel.inputs import batches, iter_lines, take_sample
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.sims.geonames import write_workload

ROUTERS = ("kdt", "kdtree", "text", "agrid", "uniform")


def _median_run(runs: list[RunResult]) -> tuple[float, RunResult]:
    """Return the median throughput of identical runs and one of them (their cost figures are equal)."""
    return statistics.median(r.throughput for r in runs), runs[0]


def part_figures(args: argparse.Namespace, workdir: Path) -> None:
    units = args.routing_units or "the scenario's"
    print(f"\n(j) PS2Stream Figure 7 on GeoNames, 8 evaluators, balancer off, {units} routing unit(s),"
          f" median of {args.repeat}")  # fmt: skip
    print(f"{'query':>5} {'router':>8} {'objects/sim s':>13} {'min-max':>15} {'total workload':>14} {'imbalance':>9}"
          f" {'subs/sub':>8} {'rows/object':>11}")  # fmt: skip
    for name in ("q1", "q2", "q3"):
        scenario = override(load_scenario(name), objects=args.objects, routing_units=args.routing_units)
        stream, vocabulary = write_workload(scenario.workload, workdir / name)
        runs: dict[str, list[RunResult]] = {router: [] for router in ROUTERS}
        for round_ in range(args.repeat):  # rounds over every router: a slower minute of the machine hits them all
            for router in ROUTERS[round_ % len(ROUTERS) :] + ROUTERS[: round_ % len(ROUTERS)]:  # each first in turn
                runs[router].append(run_strategy(scenario, stream, vocabulary, Strategy(router, "off", 8)))
        results = {}
        for router in ROUTERS:
            throughput, run = _median_run(runs[router])
            results[router] = (throughput, run)
            spread = f"{min(r.throughput for r in runs[router]):,.0f}-{max(r.throughput for r in runs[router]):,.0f}"
            print(f"{name:>5} {router:>8} {throughput:>13,.0f} {spread:>15} {run.total_workload:>14,}"
                  f" {run.imbalance:>9.2f} {run.replication:>8.2f} {run.shipping:>11.2f}")  # fmt: skip
        kdt, kdtree, text = results["kdt"][0], results["kdtree"][0], results["text"][0]
        least = min(results, key=lambda r: results[r][1].total_workload)
        if name == "q3":
            ratio = kdt / max(kdtree, text)
            verdict = "met" if ratio >= 1.3 else "NOT met"
            print(f"      target: kdt {ratio:.2f}x the better of kdtree and text (>= 1.3: {verdict});"
                  f" least total workload: {least} ({'met' if least == 'kdt' else 'NOT met'})")  # fmt: skip
        else:
            peer = "kdtree" if name == "q1" else "text"
            ratio = kdt / results[peer][0]
            print(f"      target: kdt {ratio:.2f}x {peer} (>= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")


def _sequencer_us_per_object(scenario, stream: Path, vocabulary: Path, router: str) -> float:
    """Return the sequencer's CPU microseconds per object over the micro-batches of objects alone.

    The collector is tuned as the engines tune it
    (:func:`~skpub.kernel.runtime.tune_gc`; with Python's default thresholds,
    full collections of the live subscriptions' objects took 1-2 s per
    batch of subscribes and fell in whichever stage was allocating). A batch
    that also carries subscribes or unsubscribes, or any line not
    accepted as an object, is left out: their routing (targets, registry,
    summaries) is not an object's cost (at 100,000 live subscriptions one
    batch holds 7,989 of them beside 12,011 objects; docs/benchmarks.md
    (j)). NaN when no batch holds objects alone.
    """
    dep = deployment_for(scenario, Strategy(router, "off", 8), vocabulary)
    lines = iter_lines(stream)
    sample = take_sample(lines, dep.sample_size)
    seconds = objects = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = LocalPipeline.new(Path(tmp), dep, load_vocabulary(dep.vocabulary, dep.vocabulary_digest), sample)
        tune_gc()  # as the engines run: under the default thresholds, collections land in whichever stage allocates
        for b, batch in enumerate(batches(itertools.chain(sample, lines), dep.batch_size)):
            report = pipeline.step(b, batch, count_outputs)
            if report.objects and report.objects == report.records:
                seconds += report.stage_cpu["sequencer"]
                objects += report.objects
    return seconds / objects * 1e6 if objects else float("nan")


def part_routing(args: argparse.Namespace, workdir: Path) -> None:
    base = load_scenario("q2")
    workload = dataclasses.replace(base.workload, live=args.live, objects=args.objects, inserts_per_object=0.0)
    scenario = dataclasses.replace(base, workload=workload, batch_size=20_000)
    stream, vocabulary = write_workload(scenario.workload, workdir / f"routing-{args.live}")
    print(f"\n(j) routing unit per object at {args.live:,} live range subscriptions (Q2 keywords),"
          f" median of {args.repeat}")  # fmt: skip
    for router in ("agrid", "text", "kdt"):
        runs = [_sequencer_us_per_object(scenario, stream, vocabulary, router) for _ in range(args.repeat)]
        print(f"  {router:>6}: sequencer {statistics.median(runs):.2f} us per object")


PARTS = {"figures": part_figures, "routing": part_routing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--objects", type=int, default=None, help="objects per workload (default: the scenario's)")
    parser.add_argument("--live", type=int, default=100_000, help="live subscriptions for the routing part")
    parser.add_argument("--routing-units", type=int, default=None,
                        help="routing units the parse stage is spread over in the figures part (PS2Stream's"
                             " Figures 6-7 ran 4 dispatchers; default: the scenario's, 1 for q1-q3); the"
                             " sequencer stays serial")  # fmt: skip
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skpub-bench-") as tmp:
        for part in args.parts:
            PARTS[part](args, Path(tmp))
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
