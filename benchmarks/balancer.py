"""Benchmark (f): the balancer's decisions, measured on GeoNames load (docs/benchmarks.md (f)).

Load: GeoNames places (cities500) as objects on the fine grid, range
subscriptions centred on random places (side 0.1-1% of the space); a cell
costs its objects x (1 + the subscriptions covering it), the form of Tornado
Eq. 1 with one unit per object (the evaluators now count ``object_cost``,
10, per object: the ``drift`` part runs them; the other parts compare
selectors and decisions on one synthetic load). It is kept in
:class:`~skpub.evaluators.load.CellLoad` and sent as a
:class:`~skpub.kernel.load.LoadSummary`.

Parts:

- ``migration``: PS2Stream Figures 12-14. For each evaluator in turn as
  w_o, with w_l at its load / r for r in :data:`IMBALANCES` and PS2Stream
  V-A's tau = (L(w_o) - L(w_l)) / 2, the subscriptions moved (S) and the
  selection time of GR, DP, SI and RA, and the optimum of the 0-1 program
  (``scipy.optimize.milp``).
- ``decision``: the adaptive decision (all candidates weighed) and applying
  it, with 64 evaluators on the 1000 x 1000 grid, median of repeats.
- ``statistics``: bytes of load summaries per batch against the
  centralized alternative (every cell with cost), Tornado Figure 9b.

- ``drift``: Tornado Figure 9a. The local engine on the drifting hot spot
  (``skpub workload geonames --drift-scale S``, range subscriptions only as
  in Tornado 5.4), 8 evaluators, ``adaptive`` against ``off``: simulated
  parallel time (per batch, the slowest evaluator's CPU plus routing and
  balancing, summed; DESIGN "Measuring load honestly") and imbalance max /
  mean of evaluator cost, averaged over each phase after its first two
  batches. Keywords from every term (percentile 100), so that objects meet
  subscriptions. It also measures Tornado's beta in cost units per
  subscription: the adaptive runs' hand-off and take-over seconds (the
  balancer stage's CPU in transfer and routing-update batches beyond an
  ordinary batch's) per subscription part moved over their evaluator CPU
  seconds per cost unit, and the parallel time of a transfer batch and a
  routing-update batch against an ordinary one. Beside the ratio it prints
  the bound on it: ``off``'s parallel time over the same batches with each
  batch's evaluator CPU spread evenly over the 8 and nothing moved (what a
  perfect, free balancer would reach; routing stays as measured). Times are
  the median of ``--drift-rounds`` runs per mode, the modes alternating
  (thread CPU seconds of identical runs vary by 20-50% on a small VM:
  docs/benchmarks.md (j)); decisions come from cost units, so every run of
  a mode must decide the same (a warning says otherwise).

- ``default``: the 10% CPU target. The GeoNames default workload (no
  drift) through the local and the Spark engine with the balancer ``off``
  and ``adaptive``, alternating, ``--repeat`` times each: the process CPU
  of a local run, and the sum of the summary's stage CPU on Spark (its
  Python work: parse, sequencer, evaluators, state writes, merge, sink and
  the balancer); median ratio adaptive / off.

Run: python -m benchmarks.balancer [--parts migration decision statistics drift default]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from skpub.app.summary import decision_seconds, parallel_seconds, slowest_evaluator_seconds
from skpub.balancer.migration import SELECTORS, optimum
from skpub.balancer.operation import apply_moves
from skpub.balancer.policy import decide
from skpub.evaluators.load import CellLoad
from skpub.kernel.config import BalancerConfig
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.router.agrid import AGrid
from skpub.router.partitioning import cost_partitioning
from skpub.sims.geonames import SPACE, load_places

BLOCK = 25


def geonames_load(size: int, subscriptions: int, seed: int = 7):
    """Return ``(grid, per-cell cost (size, size), subscription cell boxes (n, 4))``."""
    rng = np.random.default_rng(seed)
    places = load_places()
    xs = np.array([p.x for p in places])
    ys = np.array([p.y for p in places])
    grid = FineGrid(SPACE, size)
    cx, cy = grid.cells_of(xs, ys)
    objects = np.zeros((size, size))
    np.add.at(objects, (cy, cx), 1.0)
    centre = rng.integers(len(xs), size=subscriptions)
    side = rng.uniform(0.001, 0.01, subscriptions)
    rects = [
        Rect(
            xs[i] - s * SPACE.width / 2,
            ys[i] - s * SPACE.height / 2,
            xs[i] + s * SPACE.width / 2,
            ys[i] + s * SPACE.height / 2,
        )
        for i, s in zip(centre.tolist(), side.tolist(), strict=True)
    ]
    boxes = np.array([grid.cell_box(r) for r in rects], dtype=np.int64)
    diff = np.zeros((size + 1, size + 1))
    np.add.at(diff, (boxes[:, 1], boxes[:, 0]), 1)
    np.add.at(diff, (boxes[:, 1], boxes[:, 2] + 1), -1)
    np.add.at(diff, (boxes[:, 3] + 1, boxes[:, 0]), -1)
    np.add.at(diff, (boxes[:, 3] + 1, boxes[:, 2] + 1), 1)
    covering = np.cumsum(np.cumsum(diff, axis=0), axis=1)[:size, :size]
    return grid, objects * (1 + covering), boxes


def summaries(grid: FineGrid, part, costs: np.ndarray, boxes: np.ndarray):
    loads = [CellLoad(grid.size, part.boxes_of(e), BLOCK, decay=1.0) for e in range(part.count)]
    ys, xs = np.nonzero(costs)
    owner = part.owner
    for cx, cy, e in zip(xs.tolist(), ys.tolist(), owner[ys, xs].tolist(), strict=True):
        loads[e].add_cost(cx, cy, float(costs[cy, cx]))
    agrid = AGrid(grid, part)
    for box in boxes.tolist():
        for e, cells in agrid.route_parts(tuple(box)):
            loads[e].add_subscription(cells)
    return [load.summary(e, 0) for e, load in enumerate(loads)], loads


IMBALANCES = (1.25, 1.5, 2.0, 3.0)
"""max / min load of the pair PS2Stream V-A's trigger weighs: sigma's threshold (1.2) just passed, then larger skews."""


def part_migration(args) -> None:
    grid, costs, boxes = geonames_load(1000, args.subscriptions)
    part = cost_partitioning(costs, 8)
    sums, _ = summaries(grid, part, costs, boxes)
    names = [*SELECTORS, "optimum"]
    print(
        f"\n(f) migration: 8 evaluators, 1000^2 grid, {args.subscriptions} subscriptions, blocks {BLOCK}^2;"
        " each evaluator in turn is w_o, w_l has its load / r, tau = (L(w_o) - L(w_l)) / 2"
    )
    print(f"{'r':>5} {'tau/L':>6} {'selector':>9} {'subs moved':>11} {'vs GR':>7} {'load/tau':>9} {'select ms':>10}")
    for ratio in IMBALANCES:
        share = (1 - 1 / ratio) / 2
        rows = {name: ([], [], []) for name in names}
        for s in sums:
            loads = np.array([b.cost for b in s.blocks])
            sizes = np.array([b.queries for b in s.blocks], dtype=np.int64)
            tau = loads.sum() * share
            for name, select in [*SELECTORS.items(), ("optimum", optimum)]:
                start = time.perf_counter()
                chosen = select(loads, sizes, tau)
                elapsed = time.perf_counter() - start
                rows[name][0].append(int(sizes[chosen].sum()))
                rows[name][1].append(float(loads[chosen].sum() / tau))
                rows[name][2].append(elapsed * 1e3)
        gr = sum(rows["GR"][0])
        for name, (moved, reached, ms) in rows.items():
            print(
                f"{ratio:>5.2f} {share:>6.3f} {name:>9} {sum(moved):>11,} {sum(moved) / gr:>7.2f}"
                f" {np.mean(reached):>9.3f} {np.mean(ms):>10.3f}"
            )
        fewer = {name: 1 - gr / sum(rows[name][0]) for name in ("SI", "RA")}
        verdict = "met" if min(fewer.values()) >= 0.3 else "NOT met"
        print(f"      GR moves {fewer['SI']:.0%} fewer than SI, {fewer['RA']:.0%} fewer than RA (>= 30%: {verdict})")


def part_decision(args) -> None:
    grid, costs, boxes = geonames_load(1000, args.subscriptions)
    part = cost_partitioning(costs, 64)
    skewed = costs.copy()
    skewed[300:400, 500:600] *= 20  # a hot spot over Europe's cells of the initial partitioning
    sums, _ = summaries(grid, part, skewed, boxes)
    for mode in ("adaptive", "chaos"):
        times, apply_times, ops = [], [], []
        for batch in range(args.repeat):
            start = time.perf_counter()
            ops = decide(BalancerConfig(mode=mode, seed=1), part, sums, batch)
            times.append(time.perf_counter() - start)
            if ops:
                start = time.perf_counter()
                apply_moves(part, [m for op in ops for m in op.moves])
                apply_times.append(time.perf_counter() - start)
        kinds = ", ".join(op.kind for op in ops) or "none"
        print(
            f"(f) decision, 64 evaluators on 1000^2, {mode}: decide {statistics.median(times) * 1e3:.1f} ms, "
            f"apply {statistics.median(apply_times) * 1e3 if apply_times else 0:.1f} ms (median of {args.repeat}; "
            f"last decision: {kinds})"
        )


def part_statistics(args) -> None:
    grid, costs, boxes = geonames_load(1000, args.subscriptions)
    print("\n(f) statistics bytes per batch: summaries vs every nonzero cell (centralized)")
    for n in (8, 64):
        part = cost_partitioning(costs, n)
        sums, loads = summaries(grid, part, costs, boxes)
        distributed = sum(s.nbytes() for s in sums)
        centralized = sum(load.centralized_nbytes() for load in loads)
        print(f"  {n:>3} evaluators: {distributed:>10,} B vs {centralized:>10,} B ({centralized / distributed:.1f}x)")


def evaluator_seconds(report) -> float:
    """Return every evaluator's CPU seconds in a batch: their rows and their balancer steps."""
    return sum(report.evaluator_cpu.values()) + sum(report.evaluator_balancer_cpu.values())


class _Recorder:
    """A run observer that keeps every batch report."""

    def __init__(self, observer) -> None:
        self.observer, self.reports = observer, []

    def __getattr__(self, name):
        return getattr(self.observer, name)

    def on_batch(self, report) -> None:
        self.reports.append(report)
        self.observer.on_batch(report)


def phase_batches(objects: list[int], phases: int) -> list[list[int]]:
    """Return, per drift phase, the indices of the batches that hold some of its objects, in order.

    ``objects`` are the objects of each batch in stream order; the workload
    gives each phase an equal share of the objects, ``ceil(total / phases)``
    (:func:`skpub.sims.geonames.write_workload`), so a batch that straddles
    a phase change belongs to both phases.
    """
    per = -(-sum(objects) // phases) or 1
    first = np.concatenate(([0], np.cumsum(objects)[:-1])).astype(int)[: len(objects)]
    return [
        [i for i, (start, n) in enumerate(zip(first.tolist(), objects, strict=True))
         if n and start < (p + 1) * per and start + n > p * per]
        for p in range(phases)
    ]  # fmt: skip


def _drift_run(stream, dep, out: str, args, phase_count: int) -> dict:
    """Run the local engine once on a drift workload; return its measures (DESIGN "Measuring load honestly").

    A phase's imbalance is the mean of its batches' after its first two
    (:func:`phase_batches`: the batches that hold its objects).
    """
    from skpub.app.engines.local import run_local
    from skpub.app.summary import RunObserver, RunSummary

    recorder = _Recorder(RunObserver(RunSummary("local", dep.router, dep.evaluators), stream=None))
    start = time.perf_counter()
    run_local(stream, out, dep, recorder)
    wall = time.perf_counter() - start
    reports = [r for r in recorder.reports if r.objects]
    n = dep.evaluators
    imbalance = [r.imbalance(n) for r in reports]
    phases = [
        float(np.mean([imbalance[i] for i in batches[2:]] or [np.nan]))
        for batches in phase_batches([r.objects for r in reports], phase_count)
    ]
    run = {
        "parallel": sum(parallel_seconds(r, 1) for r in reports),
        "spread": sum(parallel_seconds(r, args.routing_units) for r in reports),
        "wall": wall,
        "phases": phases,
        "ops": sum(c for r in reports for k, c in r.balancer.items() if k not in ("subscriptions", "placements")),
        "imbalance": imbalance,
        "parse": sum(r.stage_cpu["parse"] for r in reports),
        "sequencer": sum(r.stage_cpu["sequencer"] for r in reports),
        "slow": sum(slowest_evaluator_seconds(r) for r in reports),
        "decide": sum(decision_seconds(r) for r in reports),
        "steps": sum(sum(r.evaluator_balancer_cpu.values()) for r in reports),
        # every evaluator's CPU, its hand-offs and take-overs included: what the balancer costs the cluster
        "evaluator_cpu": sum(evaluator_seconds(r) for r in reports),
        # in cost units (Tornado Eq. 1): per batch the busiest evaluator's cost, and all evaluators' cost
        "cost_parallel": sum(max(r.evaluator_cost.values(), default=0) for r in reports),
        "cost_total": sum(sum(r.evaluator_cost.values()) for r in reports),
    }
    # the most a balancer could gain: each batch's evaluator CPU spread evenly, moving nothing, for free
    even = [parallel_seconds(r, u) - slowest_evaluator_seconds(r) + evaluator_seconds(r) / n
            for u in (1, args.routing_units) for r in reports]  # fmt: skip
    run["bound"] = (run["parallel"] / sum(even[: len(reports)]), run["spread"] / sum(even[len(reports) :]))
    lines = [
        json.loads(line)
        for part in sorted(Path(out, "balancer").glob("*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    run["kinds"] = Counter(row["operation"] for row in lines)
    moved = sum(row["subscription_parts_moved"] for row in lines)
    unit = sum(sum(r.evaluator_cpu.values()) for r in reports) / max(
        sum(sum(r.evaluator_cost.values()) for r in reports), 1
    )
    per_batch = {r.batch_id: parallel_seconds(r, 1) for r in reports}
    transfer = {row["transfer_batch"] for row in lines} & set(per_batch)
    update = {row["first_batch"] for row in lines} & set(per_batch)
    plain = set(per_batch) - transfer - update
    if moved and plain and transfer and update:
        usual = statistics.median(r.stage_cpu["balancer"] for r in reports if r.batch_id in plain)
        work = sum(r.stage_cpu["balancer"] - usual for r in reports if r.batch_id in transfer | update)
        run["beta"] = (work / moved / unit, work, moved)
        run["batches"] = tuple(statistics.median(per_batch[b] for b in kind) for kind in (plain, transfer, update))
    return run


def part_drift(args) -> None:
    import tempfile

    from skpub.kernel.config import Deployment, deployment_from_json
    from skpub.sims.geonames import WorkloadSpec, deployment_of, write_workload

    rounds = args.drift_rounds
    if rounds < 1:
        raise SystemExit("--drift-rounds must be at least 1")
    print(f"\n(f) drifting hot spot, 8 evaluators, batches of {args.batch_size}, {args.objects or 'all'} objects;"
          f" times: median of {rounds} runs per mode, alternating (the range in brackets)")  # fmt: skip
    units = f"{args.routing_units} RU s"
    print(f"{'scale':>5} {'mode':>8} {'parallel s':>10} {units:>9} {'wall s':>7} {'imbalance':>9} {'per phase':>24}"
          f" {'ops':>4}  [parallel s, min-max]")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scales:
            spec = WorkloadSpec(
                objects=args.objects,
                drift_scale=scale,
                topk_fraction=0.0,
                knn_fraction=0.0,
                window=0,
                keyword_percentile=100.0,
                live=args.live,
                burst_regions=args.burst_regions,
                max_side=args.max_side,
                inserts_per_object=args.inserts_per_object,
                shift_at=args.shift_at,
            )
            stream, vocabulary = write_workload(spec, f"{tmp}/workload-{scale}")
            base: Deployment = deployment_from_json(deployment_of(spec)).replace(
                evaluators=8, batch_size=args.batch_size, vocabulary=str(vocabulary)
            )
            names = ("sigma", "beta", "decay", "horizon", "global_period", "object_cost")
            chosen = {name: getattr(args, name) for name in names}
            overrides = {name: value for name, value in chosen.items() if value is not None}
            deployments = {
                mode: base.replace(balancer=BalancerConfig(mode=mode, **overrides)) for mode in ("off", "adaptive")
            }
            runs: dict[str, list[dict]] = {"off": [], "adaptive": []}
            for attempt in range(rounds):
                for mode in ("off", "adaptive") if attempt % 2 == 0 else ("adaptive", "off"):
                    out = f"{tmp}/out-{scale}-{mode}-{attempt}"
                    runs[mode].append(_drift_run(stream, deployments[mode], out, args, spec.drift_phases))
                    shutil.rmtree(out)
            medians = {}
            for mode in ("off", "adaptive"):
                first = runs[mode][0]
                if any((r["ops"], r["imbalance"]) != (first["ops"], first["imbalance"]) for r in runs[mode]):
                    print(f"      WARNING: the {mode} runs decided differently: a decision must not depend on time")
                med = {k: statistics.median(r[k] for r in runs[mode]) for k in ("parallel", "spread", "wall")}
                medians[mode] = med
                low, high = min(r["parallel"] for r in runs[mode]), max(r["parallel"] for r in runs[mode])
                if mode == "adaptive":
                    kinds = first["kinds"]
                    print("      operations: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
                    if "beta" in first:
                        beta, work, moved = first["beta"]
                        ordinary, transfer, update = first["batches"]
                        print(f"      beta measured (first run): {beta:.1f} cost units per subscription part moved"
                              f" (hand-off and take-over seconds {work:.2f} over {moved} parts)")  # fmt: skip
                        print(f"      batch parallel s, median: ordinary {ordinary:.3f}, transfer {transfer:.3f},"
                              f" routing update {update:.3f}")  # fmt: skip
                shown = " ".join(f"{v:.2f}" for v in first["phases"])
                print(f"{scale:>5} {mode:>8} {med['parallel']:>10.2f} {med['spread']:>9.2f} {med['wall']:>7.1f}"
                      f" {np.nanmean(first['phases']):>9.2f} {shown:>24} {first['ops']:>4}"
                      f"  [{low:.2f}-{high:.2f}]")  # fmt: skip
                stage = {k: statistics.median(r[k] for r in runs[mode]) for k in ("parse", "sequencer", "slow",
                                                                                   "steps", "decide")}  # fmt: skip
                print(f"      of which parse {stage['parse']:.2f} s, sequencer {stage['sequencer']:.2f} s, slowest"
                      f" evaluators {stage['slow']:.2f} s (their balancer steps {stage['steps']:.2f} s),"
                      f" decisions {stage['decide']:.2f} s")  # fmt: skip
            cpu = {mode: statistics.median(r["evaluator_cpu"] for r in runs[mode]) for mode in runs}
            print(f"{scale:>5} evaluator CPU, every evaluator with its balancer steps: off {cpu['off']:.2f} s,"
                  f" adaptive {cpu['adaptive']:.2f} s ({cpu['adaptive'] / cpu['off']:.2f}x)")  # fmt: skip
            off_run, adaptive_run = runs["off"][0], runs["adaptive"][0]  # cost units: the same in every run
            perfect = off_run["cost_total"] / base.evaluators
            print(f"{scale:>5} parallel cost (the busiest evaluator's, summed): off {off_run['cost_parallel']:,.0f},"
                  f" adaptive {adaptive_run['cost_parallel']:,.0f}, perfect balance of off's total {perfect:,.0f};"
                  f" adaptive {adaptive_run['cost_parallel'] / perfect:.2f}x the bound,"
                  f" {off_run['cost_parallel'] / adaptive_run['cost_parallel']:.2f}x below off")  # fmt: skip
            bound = [statistics.median(r["bound"][u] for r in runs["off"]) for u in (0, 1)]
            ratios = [o["parallel"] / a["parallel"] for o, a in zip(runs["off"], runs["adaptive"], strict=True)]
            gain = medians["off"]["parallel"] / medians["adaptive"]["parallel"]
            print(f"{scale:>5} off/adaptive parallel time: {gain:.2f}x"
                  f" with one routing unit (rounds {min(ratios):.2f}-{max(ratios):.2f}),"
                  f" {medians['off']['spread'] / medians['adaptive']['spread']:.2f}x with {args.routing_units};"
                  f" a perfect balance moving nothing would give {bound[0]:.2f}x and {bound[1]:.2f}x")  # fmt: skip


def part_default(args) -> None:
    import resource
    import tempfile

    from skpub.app.engines.local import run_local
    from skpub.app.engines.spark import run_spark, spark_session
    from skpub.app.summary import STAGES, RunObserver, RunSummary
    from skpub.kernel.config import Deployment, Window
    from skpub.sims.geonames import WorkloadSpec, write_workload

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    print(f"\n(f) GeoNames default, no drift: CPU of adaptive over off, median of {args.repeat} alternating runs")
    with tempfile.TemporaryDirectory() as tmp:
        spec = WorkloadSpec()
        stream, vocabulary = write_workload(spec, f"{tmp}/workload")
        base = Deployment(vocabulary=str(vocabulary), window=Window("count", spec.window))
        spark = spark_session("local[2]", base.evaluators)
        for engine in ("local", "spark"):
            seconds: dict[str, list[float]] = {"off": [], "adaptive": []}
            operations = 0
            for attempt in range(args.repeat):
                for mode in ("off", "adaptive"):
                    dep = base.replace(balancer=BalancerConfig(mode=mode))
                    observer = RunObserver(RunSummary(engine, dep.router, dep.evaluators), stream=None)
                    out = f"{tmp}/out-{engine}-{mode}-{attempt}"
                    start = cpu()
                    if engine == "local":
                        summary = run_local(stream, out, dep, observer)
                        seconds[mode].append(cpu() - start)
                    else:
                        summary = run_spark(stream, out, dep, observer, spark=spark)
                        stages = (*STAGES, "state_writes", "balancer")
                        seconds[mode].append(sum(summary.stage_cpu[k] for k in stages))
                    operations += sum(
                        n for k, n in summary.balancer.items() if k not in ("subscriptions", "placements")
                    )
            off, adaptive = statistics.median(seconds["off"]), statistics.median(seconds["adaptive"])
            print(f"  {engine:>5}: off {off:6.2f} s, adaptive {adaptive:6.2f} s CPU: {adaptive / off:.3f}x"
                  f" ({operations} operations)")  # fmt: skip
        spark.stop()


PARTS = {
    "migration": part_migration,
    "decision": part_decision,
    "statistics": part_statistics,
    "drift": part_drift,
    "default": part_default,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--subscriptions", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.4, 0.55, 0.7])
    parser.add_argument("--objects", type=int, default=None, help="objects of the drift workload (default all)")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--live", type=int, default=10_000, help="live subscriptions of the drift workload")
    parser.add_argument("--max-side", type=float, default=0.015, help="largest subscription side (share of the space)")
    parser.add_argument("--inserts-per-object", type=float, default=0.1, help="subscription turnover")
    parser.add_argument("--burst-regions", type=float, default=0.0, help="keyword burst share of the drift workload")
    parser.add_argument("--routing-units", type=int, default=8, help="routing units the parse stage is spread over")
    parser.add_argument("--sigma", type=float, default=None, help="the adaptive runs' sigma (default the deployment's)")
    parser.add_argument("--beta", type=float, default=None, help="the adaptive runs' beta (default the deployment's)")
    parser.add_argument(
        "--horizon", type=int, default=None, help="the adaptive runs' horizon (default the deployment's)"
    )
    parser.add_argument("--decay", type=float, default=None, help="the statistics' decay (default: the deployment's)")
    parser.add_argument(
        "--object-cost",
        type=int,
        default=None,
        help="the drift runs' cost units of an object beside its candidates (default: the deployment's)",
    )
    parser.add_argument("--drift-rounds", type=int, default=3, help="runs per mode of the drift part, alternating")
    parser.add_argument("--shift-at", type=float, default=0.0,
                        help="the drift stream shifts once, after this share of its objects (Tornado 5.4)")  # fmt: skip
    parser.add_argument("--global-period", type=int, default=None,
                        help="batches between global adjustment checks, 0: never")  # fmt: skip
    args = parser.parse_args()
    for name in args.parts:
        PARTS[name](args)


if __name__ == "__main__":
    main()
