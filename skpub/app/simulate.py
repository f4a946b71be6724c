"""``skpub simulate``: workload-skew simulations for capacity planning.

A *scenario* (a JSON file; the shipped ones are in ``sims/scenarios/``) is a
GeoNames workload (:class:`skpub.sims.geonames.WorkloadSpec`), a batch size
and the *strategies* to compare: every combination of its routers, balancer
modes and evaluator counts. Each strategy runs the whole stream through the
embedded engine (:class:`skpub.app.engines.local.LocalPipeline`: the same
routing unit, evaluators, merge and balancer as every run), its outputs
counted, not written, and each micro-batch gives the figures PS2Stream and
Tornado compare strategies by (:class:`BatchFigures`):

- simulated parallel seconds (:func:`skpub.app.summary.parallel_seconds`:
  routing, the slowest evaluator, the balancer; DESIGN "Measuring load
  honestly"), and simulated throughput = objects / parallel seconds. The
  scenario's ``routing_units`` (default 1) spread the parse stage, which is
  per line (one task per input split on Spark), as Tornado's and
  PS2Stream's several routing units / dispatchers do; the sequencer stays
  serial. The routing unit's share is reported beside, so a planner sees
  whether routing or the evaluators bound the throughput;
- imbalance max / mean of evaluator cost (Tornado Eq. 1 cost units);
- total workload, PS2Stream's objective (Definition 2): the sum of every
  evaluator's cost, replication included;
- range subscription parts per range subscription (replication) and object
  rows forwarded per object (shipping);
- the balancer's operations and the subscription parts they moved.

:func:`recommend` picks the strategy a capacity planner should start from;
:mod:`skpub.app.report` writes the report.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import msgspec

from skpub.app.engines.local import LocalPipeline
from skpub.app.progress import RUNS, ProgressDisplay
from skpub.app.summary import BatchReport, parallel_seconds, routing_unit_seconds
from skpub.kernel.config import (
    BALANCER_MODES,
    MAX_EVALUATORS,
    ROUTERS,
    BalancerConfig,
    Deployment,
    deployment_from_json,
)
from skpub.kernel.errors import ConfigError
from skpub.kernel.inputs import batches, iter_lines, take_sample
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.router.partitioning import Partitioning
from skpub.sims import SCENARIOS, shipped_scenarios
from skpub.sims.geonames import WorkloadSpec, deployment_of, write_workload

MAX_STRATEGIES = 64
"""Most strategies one scenario may ask for (each is a whole run)."""
MAX_LIVE = 1_000_000
MAX_BATCH = 1_000_000
MAX_MAPS = 12
MAX_ROUTING_UNITS = 1024
"""Bounds on what a scenario file may ask for: live subscriptions, records per batch, batches drawn on the map,
routing units (evaluators per strategy: a deployment's own bound, ``MAX_EVALUATORS``)."""
SCENARIO_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A scenario's name (its file's stem) names its report files."""


class _ScenarioFile(msgspec.Struct, forbid_unknown_fields=True):
    """The JSON form of a scenario, as decoded (validated in :func:`parse_scenario`)."""

    title: str
    workload: dict = msgspec.field(default_factory=dict)
    description: str = ""
    batch_size: int = 2000
    routers: list[str] = msgspec.field(default_factory=lambda: ["agrid", "kdtree", "uniform"])
    balancers: list[str] = msgspec.field(default_factory=lambda: ["off", "adaptive"])
    evaluators: list[int] = msgspec.field(default_factory=lambda: [8])
    maps: list[int] = msgspec.field(default_factory=lambda: [0, -1])
    routing_units: int = 1


@dataclass(frozen=True)
class Scenario:
    """A workload and the strategies to run it with.

    ``maps`` are the micro-batches whose partitions the report draws
    (negative: counted from the last, ``-1`` the last); ``routing_units``
    share the parse stage (:func:`skpub.app.summary.parallel_seconds`).
    """

    name: str
    title: str
    description: str
    workload: WorkloadSpec
    batch_size: int
    routers: tuple[str, ...]
    balancers: tuple[str, ...]
    evaluators: tuple[int, ...]
    maps: tuple[int, ...]
    routing_units: int = 1

    def strategies(self) -> list[Strategy]:
        """Return every (router, balancer, evaluators) combination, evaluators slowest-varying."""
        return [Strategy(r, b, n) for n, r, b in itertools.product(self.evaluators, self.routers, self.balancers)]


@dataclass(frozen=True, order=True)
class Strategy:
    """One way to run a scenario: a router, a balancer mode and an evaluator count."""

    router: str
    balancer: str
    evaluators: int

    @property
    def label(self) -> str:
        """Return ``router · balancer · N ev``."""
        return f"{self.router} · {self.balancer} · {self.evaluators} ev"


def parse_scenario(name: str, data: bytes) -> Scenario:
    """Decode and check one scenario file's bytes.

    Raises
    ------
    ConfigError
        If the JSON is malformed, has unknown fields, or names a router,
        balancer mode, evaluator count or workload parameter skpub does not
        have; the message says which.
    """
    if not SCENARIO_NAME_RE.fullmatch(name):
        raise ConfigError(f"scenario name {name!r}: use 1-64 letters, digits, '_' or '-' (the file's name)")
    try:
        raw = msgspec.json.decode(data, type=_ScenarioFile)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"scenario {name}: {exc}") from None
    unknown = sorted(set(raw.workload) - {f.name for f in dataclasses.fields(WorkloadSpec)})
    if unknown:
        raise ConfigError(f"scenario {name}: workload: unknown fields {unknown}")
    try:
        workload = msgspec.convert(raw.workload, WorkloadSpec)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise ConfigError(f"scenario {name}: workload: {exc}") from None
    problems = [f"router {r!r} (one of {ROUTERS})" for r in raw.routers if r not in ROUTERS]
    problems += [f"balancer {b!r} (one of {BALANCER_MODES})" for b in raw.balancers if b not in BALANCER_MODES]
    problems += [f"evaluators {n} (1 to {MAX_EVALUATORS})" for n in raw.evaluators if not 1 <= n <= MAX_EVALUATORS]
    if not 1 <= raw.batch_size <= MAX_BATCH:
        problems.append(f"batch_size {raw.batch_size} (1 to {MAX_BATCH})")
    if workload.live > MAX_LIVE:
        problems.append(f"workload live {workload.live} (at most {MAX_LIVE})")
    if not 1 <= raw.routing_units <= MAX_ROUTING_UNITS:
        problems.append(f"routing_units {raw.routing_units} (1 to {MAX_ROUTING_UNITS})")
    if len(raw.maps) > MAX_MAPS:
        problems.append(f"{len(raw.maps)} maps (at most {MAX_MAPS})")
    if not (raw.routers and raw.balancers and raw.evaluators):
        problems.append("no strategy (routers, balancers and evaluators must not be empty)")
    count = len(set(raw.routers)) * len(set(raw.balancers)) * len(set(raw.evaluators))
    if count > MAX_STRATEGIES:
        problems.append(f"{count} strategies (at most {MAX_STRATEGIES})")
    if problems:
        raise ConfigError(f"scenario {name}: " + "; ".join(problems))
    unique = lambda xs: tuple(dict.fromkeys(xs))  # noqa: E731 - order-keeping dedupe
    return Scenario(
        name, raw.title, raw.description, workload, raw.batch_size,
        unique(raw.routers), unique(raw.balancers), unique(raw.evaluators), unique(raw.maps), raw.routing_units,
    )  # fmt: skip


def override(scenario: Scenario, **changes: object) -> Scenario:
    """Return ``scenario`` with the command line's choices; None keeps the scenario's.

    ``routers``, ``balancers`` and ``evaluators`` are sequences; ``objects``
    replaces the workload's, ``routing_units`` the scenario's.

    Raises
    ------
    ConfigError
        If ``objects`` is below 1, or an evaluator count or ``routing_units``
        is out of its range.
    """
    objects = changes.pop("objects", None)
    units = changes.pop("routing_units", None)
    if units is not None:
        if not 1 <= units <= MAX_ROUTING_UNITS:
            raise ConfigError(f"--routing-units must be 1 to {MAX_ROUTING_UNITS}")
        scenario = dataclasses.replace(scenario, routing_units=units)
    if objects is not None:
        if objects < 1:
            raise ConfigError("--objects must be 1 or more")
        scenario = dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, objects=objects))
    kept = {k: tuple(dict.fromkeys(v)) for k, v in changes.items() if v is not None}
    if any(not 1 <= n <= MAX_EVALUATORS for n in kept.get("evaluators", ())):
        raise ConfigError(f"--evaluators must be 1 to {MAX_EVALUATORS}")
    count = len(kept.get("routers", scenario.routers)) * len(kept.get("balancers", scenario.balancers))
    if count * len(kept.get("evaluators", scenario.evaluators)) > MAX_STRATEGIES:
        raise ConfigError(f"more than {MAX_STRATEGIES} strategies for scenario {scenario.name}")
    return dataclasses.replace(scenario, **kept)


def load_scenario(ref: str) -> Scenario:
    """Load a scenario by shipped name (``q3``) or by path to a JSON file.

    Raises
    ------
    ConfigError
        If there is no such scenario, or it does not parse (:func:`parse_scenario`).
    """
    path = Path(ref)
    if path.suffix == ".json" or path.exists():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read scenario {ref}: {exc.strerror or exc}") from None
        return parse_scenario(path.stem, data)
    if ref not in shipped_scenarios():
        raise ConfigError(f"no scenario {ref!r}: shipped ones are {', '.join(shipped_scenarios())}, or give a path")
    return parse_scenario(ref, (SCENARIOS / f"{ref}.json").read_bytes())


@dataclass(frozen=True)
class BatchFigures:
    """One micro-batch of one strategy's run.

    Seconds are thread CPU; cost is the evaluators' cost units (DESIGN
    glossary *cost*: candidate subscriptions per object, range and ranked,
    Tornado Eq. 1, plus ``BalancerConfig.object_cost`` per object).
    ``routing_unit_seconds`` is the routing unit's part of ``parallel_seconds``
    (:func:`skpub.app.summary.routing_unit_seconds`: the parse spread over
    the scenario's routing units, the sequencer, the balancing decision).
    """

    batch: int
    objects: int
    parallel_seconds: float
    routing_unit_seconds: float
    max_cost: int
    total_workload: int
    imbalance: float
    replication: float
    shipping: float
    operations: int
    parts_moved: int
    deliveries: int


@dataclass
class RunResult:
    """A whole run of one strategy: its batches and the partitionings in force at the drawn batches."""

    scenario: str
    strategy: Strategy
    batches: list[BatchFigures] = field(default_factory=list)
    maps: dict[int, Partitioning] = field(default_factory=dict)
    wall_seconds: float = 0.0
    routing_units: int = 1

    @property
    def objects(self) -> int:
        """Objects accepted over the run."""
        return sum(b.objects for b in self.batches)

    @property
    def parallel_seconds(self) -> float:
        """Simulated parallel seconds over the run."""
        return sum(b.parallel_seconds for b in self.batches)

    @property
    def routing_unit_share(self) -> float:
        """The routing unit's share of the simulated parallel seconds over the run (0 to 1)."""
        total = self.parallel_seconds
        return sum(b.routing_unit_seconds for b in self.batches) / total if total else 0.0

    @property
    def throughput(self) -> float:
        """Simulated throughput, objects per simulated parallel second."""
        return self.objects / self.parallel_seconds if self.parallel_seconds else 0.0

    @property
    def total_workload(self) -> int:
        """PS2Stream's objective over the run: every evaluator's cost, summed (cost units)."""
        return sum(b.total_workload for b in self.batches)

    @property
    def imbalance(self) -> float:
        """Mean over the batches with objects of max / mean evaluator cost."""
        values = [b.imbalance for b in self.batches if b.objects]
        return sum(values) / len(values) if values else 1.0

    @property
    def replication(self) -> float:
        """Range subscription parts per range subscription, at the last batch."""
        return self.batches[-1].replication if self.batches else 0.0

    @property
    def shipping(self) -> float:
        """Object rows forwarded to evaluators per accepted object, over the run."""
        objects = self.objects
        return sum(b.shipping * b.objects for b in self.batches) / objects if objects else 0.0

    @property
    def operations(self) -> int:
        """Balancer operations over the run."""
        return sum(b.operations for b in self.batches)

    @property
    def parts_moved(self) -> int:
        """Subscription parts the balancer's operations moved."""
        return sum(b.parts_moved for b in self.batches)


def count_outputs(batch_id, deliveries, dead_letters, statistics, report, events=(), snapshots=()):  # noqa: ANN001, ANN202, ARG001
    """Write nothing (a :data:`~skpub.app.engines.local.Sink`): the pipeline counted the batch in its report."""


def _figures(report: BatchReport, pipeline: LocalPipeline, routing_units: int) -> BatchFigures:
    evaluators = len(pipeline.evaluators)
    costs = report.costs_per_evaluator(evaluators)
    total = sum(costs)
    parts = sum(len(ev.range_ids()) for ev in pipeline.evaluators)
    distinct = len(set().union(*(ev.range_ids() for ev in pipeline.evaluators)))
    operations = sum(n for k, n in report.balancer.items() if k not in ("subscriptions", "placements"))
    return BatchFigures(
        batch=report.batch_id,
        objects=report.objects,
        parallel_seconds=parallel_seconds(report, routing_units),
        routing_unit_seconds=routing_unit_seconds(report, routing_units),
        max_cost=max(costs),
        total_workload=total,
        imbalance=report.imbalance(evaluators),
        replication=parts / distinct if distinct else 0.0,
        shipping=report.forwarded / report.objects if report.objects else 0.0,
        operations=operations,
        parts_moved=report.balancer["subscriptions"],
        deliveries=report.deliveries,
    )


def deployment_for(scenario: Scenario, strategy: Strategy, vocabulary: Path) -> Deployment:
    """Return the deployment one strategy runs a scenario with (the workload's space and window)."""
    return deployment_from_json(deployment_of(scenario.workload)).replace(
        evaluators=strategy.evaluators,
        router=strategy.router,
        batch_size=scenario.batch_size,
        vocabulary=str(vocabulary),
        balancer=BalancerConfig(mode=strategy.balancer),
    )


def run_strategy(
    scenario: Scenario,
    stream: Path,
    vocabulary: Path,
    strategy: Strategy,
    on_batch: Callable[[BatchFigures], None] = lambda figures: None,
) -> RunResult:
    """Run ``stream`` through the embedded engine with one strategy; return its figures.

    Outputs are counted, not written; the balancer's log goes to a
    temporary directory removed at the end. Memory: the engine's, O(live
    subscriptions + window); the figures are O(batches).
    """
    deployment = deployment_for(scenario, strategy, vocabulary)
    words = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    lines = iter_lines(stream)
    sample = take_sample(lines, deployment.sample_size)
    result = RunResult(scenario.name, strategy, routing_units=scenario.routing_units)
    epochs: dict[int, Partitioning] = {}
    in_force: list[int] = []
    tune_gc()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skpub-simulate-") as tmp:
        pipeline = LocalPipeline.new(Path(tmp), deployment, words, sample)
        for batch_id, batch in enumerate(batches(itertools.chain(sample, lines), deployment.batch_size)):
            report = pipeline.step(batch_id, batch, count_outputs)
            epochs.setdefault(pipeline.epoch.number, pipeline.epoch.table.partitioning)
            in_force.append(pipeline.epoch.number)
            result.batches.append(_figures(report, pipeline, scenario.routing_units))
            on_batch(result.batches[-1])
    result.wall_seconds = time.perf_counter() - start
    for wanted in scenario.maps:
        batch = wanted if wanted >= 0 else len(in_force) + wanted
        if 0 <= batch < len(in_force):
            result.maps[batch] = epochs[in_force[batch]]
    return result


@dataclass(frozen=True)
class Recommendation:
    """The strategy to start from, and why, in one sentence."""

    result: RunResult
    reason: str


def recommend(results: Sequence[RunResult], enough: float = 0.9, noise: float = 0.05) -> Recommendation:
    """Pick the strategy a capacity planner should start from.

    For each evaluator count, the strategies within ``noise`` of the highest
    simulated throughput are equally fast (CPU timings of one run vary by
    a few percent); among them the best is the one with the lowest total
    workload, then the fewest balancer operations. The pick is the best of
    the fewest evaluators whose throughput is at least ``enough`` of the
    best of any count: more evaluators than that buy less than
    ``1 - enough`` more.

    Raises
    ------
    ValueError
        If ``results`` is empty.
    """
    if not results:
        raise ValueError("no results to recommend from")
    best: dict[int, RunResult] = {}
    for n in sorted({r.strategy.evaluators for r in results}):
        group = [r for r in results if r.strategy.evaluators == n]
        fastest = max(r.throughput for r in group)
        close = [r for r in group if r.throughput >= (1 - noise) * fastest]
        best[n] = min(close, key=lambda r: (r.total_workload, r.operations, -r.throughput))
    top = max(r.throughput for r in best.values())
    pick = best[min(n for n, r in best.items() if r.throughput >= enough * top)]
    reason = f"{pick.strategy.label}: {pick.throughput:,.0f} objects per simulated second"
    same = [r for r in results if r.strategy.evaluators == pick.strategy.evaluators and r is not pick]
    slower = [r for r in same if r.throughput < (1 - noise) * pick.throughput]
    if slower:
        runner = max(slower, key=lambda r: r.throughput)
        reason += f", {pick.throughput / runner.throughput:.2f}x the next clearly slower ({runner.strategy.label})"
    ties = [r for r in same if r not in slower]
    if ties:
        reason += f"; as fast within {noise:.0%} as {len(ties)} other(s), with the least total workload"
    if pick.throughput < top:
        more = max(best.values(), key=lambda r: r.throughput)
        reason += f"; {more.strategy.evaluators} evaluators give only {top / pick.throughput - 1:.0%} more"
    return Recommendation(pick, reason + ".")


def median_run(runs: Sequence[RunResult]) -> RunResult:
    """Combine identical runs of one strategy: per batch the median simulated parallel and routing seconds.

    Everything but CPU timing is the same in every run (the engine is
    deterministic), so the other figures are the first run's.

    Raises
    ------
    ValueError
        If ``runs`` is empty or the runs differ in their batches.
    """
    if not runs:
        raise ValueError("no runs to combine")
    first = runs[0]
    if any(len(r.batches) != len(first.batches) for r in runs):
        raise ValueError("runs of one strategy differ in their batches")
    batches = [
        dataclasses.replace(
            b,
            parallel_seconds=statistics.median(r.batches[i].parallel_seconds for r in runs),
            routing_unit_seconds=statistics.median(r.batches[i].routing_unit_seconds for r in runs),
        )
        for i, b in enumerate(first.batches)
    ]
    wall = statistics.median(r.wall_seconds for r in runs)
    return RunResult(first.scenario, first.strategy, batches, first.maps, wall, first.routing_units)


def simulate(
    scenarios: Sequence[Scenario],
    workdir: Path,
    progress: Callable[[int, str], None] = lambda done, text: None,
    repeat: int = 1,
) -> list[tuple[Scenario, list[RunResult]]]:
    """Run every strategy of every scenario ``repeat`` times; return the results in scenario and strategy order.

    The workloads are written under ``workdir/<scenario>/`` (reused when
    their spec did not change). ``progress(done, text)`` receives the runs
    done and what happens: one line per run, and the batch a long run is at
    every 5 s. With ``repeat`` > 1 each strategy's
    batches take the median parallel seconds of its runs (:func:`median_run`),
    which steadies the comparison of strategies within a few percent.

    Raises
    ------
    ConfigError
        If a strategy's deployment is refused (a uniform layout its grid
        cannot hold), before any workload is written or run.
    """
    for scenario in scenarios:  # every deployment is checked before the first run, not when its turn comes
        for strategy in scenario.strategies():
            deployment_for(scenario, strategy, workdir / scenario.name / "vocabulary.json")
    runs = sum(len(s.strategies()) for s in scenarios)
    done = 0
    out = []
    for scenario in scenarios:
        progress(done, f"{scenario.name}: writing the workload")
        stream, vocabulary = write_workload(scenario.workload, workdir / scenario.name)
        results = []
        for strategy in scenario.strategies():
            head = f"[{done + 1}/{runs}] {scenario.name} · {strategy.label}"
            last = [time.perf_counter()]

            def tick(figures: BatchFigures, head: str = head, last: list[float] = last, done: int = done) -> None:
                if time.perf_counter() - last[0] >= 5:
                    last[0] = time.perf_counter()
                    progress(done, f"{head}: batch {figures.batch}")

            result = median_run([run_strategy(scenario, stream, vocabulary, strategy, tick) for _ in range(repeat)])
            done += 1
            progress(
                done,
                f"{head}: {len(result.batches)} batches in {result.wall_seconds:.1f} s, "
                f"{result.throughput:,.0f} objects/simulated s, imbalance {result.imbalance:.2f}",
            )
            results.append(result)
        out.append((scenario, results))
    return out


def figures_json(result: RunResult) -> dict:
    """Return one run's totals as a JSON-able dict (the strategies table's row)."""
    return {
        "scenario": result.scenario,
        **asdict(result.strategy),
        "objects": result.objects,
        "routing_units": result.routing_units,
        "parallel_seconds": round(result.parallel_seconds, 6),
        "routing_unit_share": round(result.routing_unit_share, 6),
        "throughput": round(result.throughput, 3),
        "total_workload": result.total_workload,
        "imbalance": round(result.imbalance, 6),
        "replication": round(result.replication, 6),
        "shipping": round(result.shipping, 6),
        "operations": result.operations,
        "parts_moved": result.parts_moved,
        "wall_seconds": round(result.wall_seconds, 3),
    }


def progress_display(runs: int, stream: TextIO = sys.stderr) -> tuple[ProgressDisplay, Callable[[int, str], None]]:
    """Return a display of ``runs`` runs on ``stream`` and the ``progress(done, text)`` callback that feeds it.

    A live bar of runs done (with the ETA) on a terminal; elsewhere one line
    per call, since each call is news (a run done, or a long run's batch).
    """
    display = ProgressDisplay(stream, runs, RUNS, every_seconds=0.0)

    def progress(done: int, text: str) -> None:
        display.update(done, "simulate", text)

    return display, progress
