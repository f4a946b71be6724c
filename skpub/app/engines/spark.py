"""The Spark engine: Structured Streaming with executor-resident evaluators.

Query shape (DESIGN "The Spark engine")::

    skpub_lines source (one micro-batch = ``parts`` slices of the input)
      -> mapInArrow(ParseTask)                    parallel: parse, validate, locate;
                                                  writes its dead letters
      -> repartition(1).mapInArrow(SequencerTask) serial: registry, placements, summaries
                                                  (kept in the sequencer's host)
      -> groupBy(evaluator).transformWithStateInPandas(EvaluatorProcessor)
                                                  RocksDB state, evaluators kept in hosts;
                                                  writes deliveries and statistics
      -> foreachBatch(Sink)                       control rows only: counters, rare dead letters

Every task writes its own part files, named by batch id and writer, so a
replayed batch rewrites exactly the same files; only counters reach the
driver.

The checkpoint directory holds everything a restart needs besides the input
(read in place, :mod:`skpub.app.engines.source`): the routing epochs (``epochs/``), the router's id
registry (``router/``: each micro-batch's changes, and the whole registry, a base, every
``ROUTER_BASE_EVERY`` batches, so a batch writes O(batch) bytes, not
O(stream)), the evaluator grouping keys and the deployment
(``manifest.json``), and Spark's own query checkpoint (``query/``). A run
killed at any point and started again with the same arguments resumes from
the last committed micro-batch and ends with exactly the same output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import orjson

from skpub.app.checkpoint import CHECKPOINT_DIR, Checkpoint, newest_base
from skpub.app.console import engine_log
from skpub.app.engines.sink import unique_letters
from skpub.app.engines.source import SOURCE_NAME, LineSource
from skpub.app.engines.spark_tasks import PARSE_REPORT_COLUMNS, PART_BYTES, ParseTask, SequencerTask
from skpub.app.journal import SegmentFiles
from skpub.app.output import check_output, claim_output, inspect_output, mark_success
from skpub.app.summary import BatchReport, EvaluatorCounts, RoutingCounts, RunObserver, RunSummary, count_batch
from skpub.balancer.transfer import balancer_step
from skpub.evaluators.merge import RankedMerge, apply_changes, decode_updates, results_json, take_changes
from skpub.kernel.config import Deployment, changes_text, deployment_changes, recorded_json
from skpub.kernel.errors import CheckpointError, EngineError, InputError, JavaNotFoundError
from skpub.kernel.inputs import STDIN, input_files, iter_lines, take_sample
from skpub.kernel.load import LoadSummary
from skpub.kernel.parts import batch_parts, write_part
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import FULL_COLLECTION_SECONDS, FullCollections, tune_gc
from skpub.kernel.slices import file_sizes
from skpub.kernel.storage import atomic_write_bytes, atomic_write_text
from skpub.kernel.text import load_vocabulary, pin_vocabulary
from skpub.kernel.transfer import read_plan, write_plan
from skpub.kernel.wire import ROUTED_FILE_COLUMNS, ddl
from skpub.router.epoch import EpochLog, RoutingEpoch
from skpub.router.initial import initial_table

MANIFEST_FORMAT = 6
"""Checkpoint layout version: 6 reads the input in place (skpub's source) instead of staging it; 5 adds
 the balancer (its directory, the evaluators' load statistics); 4 saves
the evaluators' last top-k/kNN reports and merge generation; 3 added the watermark to the router's state, the
evaluators' window and top-k/kNN state, and the merge's results. A checkpoint of another version is never
resumed (it is replaced with ``--overwrite``)."""
MERGE_BASE_EVERY = 16
"""Every this many micro-batches the merge's results are saved whole (deltas in between)."""
DRIVER_JAVA_OPTIONS = "-XX:+UseSerialGC"
"""The driver JVM (which hosts the executors in local mode) uses the serial collector.

Measured with ``benchmarks/memory.py`` on 2 cores: under G1 the JVM's resident
memory kept growing with the number of micro-batches (860 MiB after 200k
objects, 1,380 MiB after 2M, live data constant), because G1 expands the heap
to meet its pause-time goals; the serial collector sizes the heap by live
data (670 vs 733 MiB) so memory stays flat as the stream grows.
"""

STATUS_RETENTION = MappingProxyType(
    {
        "spark.ui.retainedJobs": "100",
        "spark.ui.retainedStages": "100",
        "spark.sql.ui.retainedExecutions": "100",
    }
)
"""How much finished work Spark's status store keeps (Spark's defaults: 1,000 jobs, stages and SQL executions).

The store is filled whether or not the UI runs (skpub disables it), and a
streaming query adds a SQL execution with its plan graph and metrics, and
its jobs and stages, at every micro-batch: under the defaults the driver
JVM's live heap kept growing through the 10-minute daemon soak
(``benchmarks/daemon.py --engine spark``; ``jcmd GC.class_histogram``:
74,000 ``SQLPlanMetric`` objects after 7 minutes, about 1 micro-batch a
second) toward a plateau some 1,000 micro-batches away; 13,400 with these
bounds, reached within the first two minutes."""

DRIVER_COLLECT_SECONDS = FULL_COLLECTION_SECONDS
"""The sink runs a full Python collection at most this often (monotonic seconds) in the driver.

Every py4j ``JavaObject`` the driver calls a method on is a reference cycle
(it caches a ``JavaMember`` that refers back to it), and with the raised
thresholds of :func:`~skpub.kernel.runtime.tune_gc` such cycles reach the
oldest generation and keep their JVM objects alive: one micro-batch's
Dataset with its plans, metrics and accumulators per batch (383 Datasets and
1.1 million ``ConcurrentHashMap`` nodes after 9 minutes of the daemon soak,
the live heap 77 -> 323 MB; 2 Datasets alive with a collection per batch).
A full collection costs about 0.1 s per million live objects not frozen at
startup (measured on 2 cores with a million tracked containers); on this
timer, deferred to 100 times a slow collection's duration
(:class:`~skpub.kernel.runtime.FullCollections`), it costs at most 1% of a
core and holds the JVM objects of the last period's micro-batches, plus the
batch in flight (longer while no batch comes)."""

ARROW_MAX_BYTES_PER_BATCH = 2**31 - 1
"""Spark's "no byte limit" value for Arrow batches sent to Python (rows per batch stay capped at 10,000).

With any other value Spark measures the Arrow batch after every row it adds
(``ArrowWriter.sizeInBytes``), which costs O(columns) per row: with our list
columns that made the sequencer's input take 8 s per 100k rows (seen in
``jstack``; 0.3 s without the check), when located rows still went through
Spark (they now go through files; the setting stays for the rows that do)."""


def require_java() -> str:
    """Return the ``java`` executable Spark will use.

    Raises
    ------
    JavaNotFoundError
        If neither ``JAVA_HOME`` nor ``PATH`` provides one.
    """
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise JavaNotFoundError(
            "the Spark engine needs Java 17 or newer and none was found: install it "
            "(e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME; "
            "or run without Spark: skpub run --engine local"
        )
    return java


def spark_session(master: str, evaluators: int, app_name: str = "skpub"):  # noqa: ANN201
    """Return a SparkSession configured for skpub's stateful streaming query."""
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(evaluators))  # a query sets its own (start_query)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "skpub.app.engines.spark_daemon")
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(ARROW_MAX_BYTES_PER_BATCH))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
        .config("spark.log.level", "ERROR")
        .config(map=dict(STATUS_RETENTION))
        .getOrCreate()
    )  # fmt: skip


FINGERPRINT_HEAD = 1 << 20
"""Bytes at the head of each input file that the checkpoint's fingerprint hashes."""


def _input_fingerprint(input_path: str | Path) -> list:
    """Path, size, modification time and SHA-256 of the head of every input file: a restart must read the same stream.

    The input is read in place, so a restart must find it as it was; hashing
    only the head keeps a start O(1) in the input's size (a file rewritten
    with the same size, head and modification time is not noticed).
    """
    out = []
    for f in input_files(input_path):
        with f.open("rb") as fh:
            head = hashlib.sha256(fh.read(FINGERPRINT_HEAD)).hexdigest()
        stat = f.stat()
        out.append([str(f.absolute()), stat.st_size, stat.st_mtime_ns, head])
    return out


def parse_parallelism(spark) -> int:  # noqa: ANN001
    """Return how many parse tasks a micro-batch gets: Spark's default parallelism (the cores), at most 64."""
    return max(1, min(64, int(spark.sparkContext.defaultParallelism)))


LOCAL_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?")
"""Spark masters that run the executors in the driver's JVM (``local``, ``local[2]``, ``local[*]``, ``local[2,3]``)."""


def evaluator_partitions(spark, evaluators: int) -> int:  # noqa: ANN001
    """Return how many shuffle partitions (evaluator-stage tasks a micro-batch) a new checkpoint's query gets.

    One per evaluator; on a local master no more than its cores
    (:func:`parse_parallelism`): a task pays a fixed cost besides its
    evaluators' work (its Python worker's state-API set-up and the state
    store's load and commit, 0.2-0.25 s a task on ``local[2]``), so two
    evaluators a task on two cores are faster than one (docs/benchmarks.md
    (u)). On a cluster, one per evaluator: executors register after the
    session starts, so the cores known when the checkpoint is made may be
    fewer than the cluster will have, and Spark fixes the number for the
    checkpoint's life.
    """
    if LOCAL_MASTER.fullmatch(spark.sparkContext.master):
        return max(1, min(evaluators, parse_parallelism(spark)))
    return evaluators


def evaluator_keys(spark, evaluators: int, partitions: int) -> list[int]:  # noqa: ANN001
    """Return one grouping-key value per evaluator, hashed by Spark to shuffle partition ``e % partitions``.

    Spark places a key in shuffle partition ``pmod(hash(key), partitions)``;
    small consecutive ids collide (DESIGN), so search for distinct values
    that spread the evaluators evenly, each partition getting
    ``evaluators // partitions`` or one more.
    """
    rows = (
        spark.range(0, 64 * evaluators + 64)
        .selectExpr("cast(id as int) as k", f"pmod(hash(cast(id as int)), {partitions}) as p")
        .collect()
    )
    free: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for row in rows:
        free[row.p].append(row.k)
    return [free[e % partitions].pop(0) for e in range(evaluators)]


def _evaluator_layout(spark, evaluators: int) -> dict:  # noqa: ANN001
    """Return a new checkpoint's manifest entries for the evaluator stage: its partitions and the evaluators' keys."""
    partitions = evaluator_partitions(spark, evaluators)
    return {"evaluator_partitions": partitions, "evaluator_keys": evaluator_keys(spark, evaluators, partitions)}


class Sink:
    """The ``foreachBatch`` sink: counters and rare dead letters of one micro-batch, idempotent per batch id."""

    def __init__(
        self, output: Path, checkpoint: Checkpoint, observer: RunObserver, deployment: Deployment, positions: bool
    ) -> None:
        self.output = output
        self.positions = positions  # the daemon's: dead letters keep their stream position (``pos``)
        self.checkpoint = checkpoint
        self.observer = observer
        self.deployment = deployment
        self.merged: tuple[int, RankedMerge] | None = None
        self.collect = FullCollections(DRIVER_COLLECT_SECONDS)

    def __call__(self, frame, batch_id: int) -> None:  # noqa: ANN001
        """Collect the evaluators' control rows, write their dead letters, merge ranked results, report the batch.

        Also collects the driver's Python garbage every ``DRIVER_COLLECT_SECONDS``
        (the last micro-batches' py4j objects, which pin JVM memory).
        """
        start = time.thread_time()
        self.collect()  # py4j's cycles (DRIVER_COLLECT_SECONDS)
        rows = sorted(frame.toArrow().to_pylist(), key=lambda r: (r["evaluator"], r["pos"] or 0))
        counters = [json.loads(r["payload"]) for r in rows if r["payload"] is not None]
        letters = unique_letters(
            DeadLetter(r["pos"], r["line"], r["reason"], r["message"]) for r in rows if r["payload"] is None
        )
        write_part(self.output, "dead_letters", batch_id, (d.to_json(self.positions) for d in letters), "d")
        routed = json.loads(self.checkpoint.router_report(batch_id).read_text())
        merge_start = time.thread_time()
        merge = self._merge_before(batch_id)
        unproven = merge.unproven
        updates = [u for r in rows if r["updates"] for u in decode_updates(r["updates"])]
        events, snapshots = merge.apply([(int(p), str(i)) for p, i in routed["marks"]], updates)
        write_part(self.output, "deliveries", batch_id, events, "m")
        write_part(self.output, "snapshots", batch_id, snapshots)
        atomic_write_bytes(self.checkpoint.merge_file("delta", batch_id), orjson.dumps(take_changes(merge)))
        if batch_id % MERGE_BASE_EVERY == MERGE_BASE_EVERY - 1:
            atomic_write_bytes(self.checkpoint.merge_file("base", batch_id), orjson.dumps(results_json(merge)))
        self.merged = (batch_id, merge)
        merge_seconds = time.thread_time() - merge_start
        routing = RoutingCounts.from_json(routed)
        evaluators = [EvaluatorCounts.from_json(c) for c in counters]
        report = BatchReport(batch_id)
        letters_counted = Counter(d.reason for d in letters)
        count_batch(report, routing, evaluators, len(events), merge.unproven - unproven, letters_counted, merge_seconds)
        if self.deployment.balancer.mode != "off":
            balance_start = time.thread_time()
            self._balance(batch_id, counters, report)
            report.stage_cpu["balancer"] = time.thread_time() - balance_start
        self._prune_files(batch_id)
        report.stage_cpu["sink"] = (
            sum(e.sink_cpu_seconds for e in evaluators)
            + time.thread_time()
            - start
            - merge_seconds
            - report.stage_cpu["balancer"]  # the driver's balancer step is its own stage, counted once
        )
        self.observer.on_batch(report)

    def _balance(self, batch_id: int, counters: list[dict], report: BatchReport) -> None:
        """After micro-batch ``batch_id``: log the transfer its sources handed off, or decide (DESIGN "The balancer").

        A decision is saved as a plan (read by the next batch's sources, and
        at the start of the one after by the targets and the sequencer)
        together with the epoch that routes from ``batch_id + 2``; both are
        deterministic functions of the evaluators' summaries, so a replayed
        batch saves the same again.

        Raises
        ------
        CheckpointError
            If a plan is damaged, or an evaluator sent no load summary.
        """
        directory = self.checkpoint.balancer
        try:
            plan = read_plan(directory, batch_id - 1)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        handoffs = sorted((c["handoff"] for c in counters if "handoff" in c), key=lambda h: h["source"])
        summaries = [
            LoadSummary.from_json(c["load"]) for c in sorted(counters, key=lambda c: c["evaluator"]) if "load" in c
        ]
        if plan is None and [s.evaluator for s in summaries] != list(range(self.deployment.evaluators)):
            raise CheckpointError(
                f"micro-batch {batch_id} lacks load summaries: got {[s.evaluator for s in summaries]}"
            )
        epochs = EpochLog(self.checkpoint.epochs)
        epoch = epochs.for_batch(batch_id) if plan is None else None
        settings = self.deployment.balancer
        decided = balancer_step(self.output, settings, batch_id, epoch, plan, handoffs, summaries, report.balancer)
        if decided is not None:
            epochs.check_order(decided[1])  # before the plan: a plan never waits for an epoch that cannot come
            write_plan(directory, decided[0])
            epochs.publish(decided[1])

    def _merge_before(self, batch_id: int) -> RankedMerge:
        """Return the merge as after micro-batch ``batch_id - 1``: kept from the last call, or rebuilt.

        A rebuilt merge holds the results from the newest merge base
        before ``batch_id`` and the deltas after it; its evaluators report
        anew at their first mark (a new generation: each subscription's home
        evaluator, and the others their non-empty results).

        Raises
        ------
        CheckpointError
            If a delta it needs is missing or damaged.
        """
        if self.merged is not None and self.merged[0] == batch_id - 1:
            return self.merged[1]
        merge = RankedMerge()
        bases = self.checkpoint.merge_files("base")
        base = newest_base(bases, batch_id)
        deltas = self.checkpoint.merge_files("delta")
        try:
            if base >= 0:
                apply_changes(merge, orjson.loads(bases[base].read_bytes()))
            for b in range(base + 1, batch_id):
                if b not in deltas:
                    raise CheckpointError(f"the merge's changes of batch {b} are missing from {self.checkpoint.merge}")
                apply_changes(merge, orjson.loads(deltas[b].read_bytes()))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise CheckpointError(f"damaged merge state in {self.checkpoint.merge}: {exc}") from None
        return merge

    def _prune_files(self, batch_id: int) -> None:
        """Drop registry, merge, row, balancer and epoch files no restart can need once ``batch_id`` is written.

        A replay of ``batch_id`` itself needs the newest base before it and
        every delta after that base; everything older goes. Located and
        routed rows are read by the batch's own tasks, which have run (a
        replay parses and sequences the batch again and writes them anew).
        Plans and hand-offs go as the batches that read them are written,
        and so do the epochs older than the one in force for
        ``batch_id - 2`` (the batch whose plan is kept): a long run keeps the
        epochs of its last batches, not one per decision of its life.
        """
        for b, paths in self.checkpoint.row_files().items():
            if b <= batch_id:
                for path in paths:
                    path.unlink(missing_ok=True)
        for b, paths in self.checkpoint.balancer_files().items():
            if (
                b < batch_id - 2
            ):  # a replay of batch_id reads the plan of batch_id - 2 and the hand-offs of batch_id - 1
                for path in paths:
                    path.unlink(missing_ok=True)
        self.checkpoint.prune_states(batch_id)
        EpochLog(self.checkpoint.epochs).prune(batch_id - 2)


def _open_checkpoint(
    checkpoint: Checkpoint,
    input_path: str | Path,
    deployment: Deployment,
    output: Path,
    spark,  # noqa: ANN001
    observer: RunObserver,
    overwrite: bool,
) -> dict:
    """Resume this run's checkpoint, or set up a new one; claim the output accordingly.

    A checkpoint is resumed when its manifest was made for this deployment,
    input and output, and the output still holds that run's parts. A
    checkpoint made for another output is refused; one made for another input
    or deployment is refused unless ``overwrite``. Anything else of skpub's
    (an unfinished setup, a finished or foreign run's parts) is cleared and
    the run starts afresh.

    Raises
    ------
    CheckpointError, OutputError
        As above, and when either directory holds files skpub did not write
        (the checkpoint's ownership is checked by the caller, and again by
        :meth:`Checkpoint.create` before anything is cleared).
    """
    state = inspect_output(output)
    wanted = json.loads(json.dumps({
        "format": MANIFEST_FORMAT,
        "deployment": deployment.to_json(),
        "input": _input_fingerprint(input_path),
        "output": str(output),
    }))  # fmt: skip
    manifest = checkpoint.read_manifest()
    if manifest is not None:
        if manifest.get("output", str(output)) != str(output):
            raise CheckpointError(
                f"checkpoint {checkpoint.root} belongs to the output {manifest['output']}, not {output}; "
                "pass another --checkpoint"
            )
        changes = deployment_changes(_recorded(manifest, wanted), wanted)
        if changes and not overwrite:
            raise CheckpointError(
                f"checkpoint {checkpoint.root} was made for another input or deployment, or by another skpub "
                f"({changes_text(changes)}); resume with that input and deployment, "
                "pass --overwrite to replace that run, or another --checkpoint"
            )
        if not overwrite and state.run_id == manifest.get("run_id"):
            claim_output(output, manifest["run_id"], overwrite, resume=True)
            observer.note(f"resuming from checkpoint {checkpoint.root}")
            return manifest
    run_id = uuid.uuid4().hex
    claim_output(output, run_id, overwrite)
    checkpoint.create()
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    table = initial_table(deployment, vocabulary, take_sample(iter_lines(input_path), deployment.sample_size))
    EpochLog(checkpoint.epochs).publish(RoutingEpoch(0, 0, table))
    parts = parse_parallelism(spark)
    observer.note(
        f"reading the input in place: micro-batches of up to {deployment.batch_size} records, {parts} parse tasks each"
    )
    manifest = {
        **wanted,
        "run_id": run_id,
        **_evaluator_layout(spark, deployment.evaluators),
        "parts": parts,
    }
    checkpoint.router.mkdir(parents=True, exist_ok=True)
    checkpoint.merge.mkdir(parents=True, exist_ok=True)
    checkpoint.balancer.mkdir(parents=True, exist_ok=True)
    atomic_write_text(checkpoint.manifest, json.dumps(manifest))
    return manifest


def run_spark(
    input_path: str | Path,
    output_dir: str | Path,
    deployment: Deployment,
    observer: RunObserver,
    master: str = "local[2]",
    checkpoint: str | Path | None = None,
    spark=None,  # noqa: ANN001
    overwrite: bool = False,
) -> RunSummary:
    """Run the stream at ``input_path`` through the Spark engine into ``output_dir``.

    Processes every input line available now (``Trigger.AvailableNow``), one
    micro-batch per ``deployment.batch_size`` lines, then stops and writes
    ``_SUCCESS``. Restarting with the same arguments resumes after the last
    committed micro-batch and completes the output, none lost, none twice.

    Parameters
    ----------
    checkpoint : path, optional
        Default ``output_dir/_checkpoint``.
    spark : SparkSession, optional
        A session to use (and leave running); by default one is started on
        ``master`` and stopped at the end.
    overwrite : bool
        Replace a finished earlier output, or a checkpoint made for another
        input or deployment (only ever skpub's own files).

    Raises
    ------
    JavaNotFoundError
        If no Java runtime is available.
    CheckpointError
        If ``checkpoint`` belongs to another run (see :func:`_open_checkpoint`).
    OutputError
        If ``output_dir`` holds foreign files, or a finished run without ``overwrite``.
    EngineError
        If the streaming query fails.
    skpub.kernel.errors.InputError
        If the input is missing, a directory without ``*.jsonl`` files, or standard input (an input of
        empty files is a run of no batch).
    """
    if str(input_path) == STDIN:
        raise InputError("the Spark engine reads files in place; use --engine local for -")
    if not all(f.is_file() for f in input_files(input_path)):
        raise InputError(f"the Spark engine reads regular files, and {input_path} is not one; use --engine local")
    output = Path(output_dir).absolute()
    if deployment.vocabulary:  # tasks and evaluator hosts read it from other working directories
        deployment = deployment.replace(vocabulary=str(Path(deployment.vocabulary).absolute()))
    deployment = pin_vocabulary(deployment)  # recorded in the manifest; every task checks the file it reads
    ckpt = Checkpoint(checkpoint or output / CHECKPOINT_DIR)
    check_output(output, overwrite)
    ckpt.check_owned()
    if spark is not None:
        return _run_query(spark, input_path, output, ckpt, deployment, observer, overwrite)
    with engine_log(output, observer) as log:
        observer.summary.log_file = str(log)
        observer.note(f"starting Spark on {master}; Spark's own log lines go to {log}")
        spark = spark_session(master, deployment.evaluators)
        try:
            return _run_query(spark, input_path, output, ckpt, deployment, observer, overwrite)
        except EngineError as exc:
            raise EngineError(f"{exc} (Spark's log: {log})") from exc
        finally:
            spark.stop()


def _run_query(
    spark,  # noqa: ANN001
    input_path: str | Path,
    output: Path,
    ckpt: Checkpoint,
    deployment: Deployment,
    observer: RunObserver,
    overwrite: bool,
) -> RunSummary:
    """Set up or resume the checkpoint, run the streaming query to the end, write ``_SUCCESS``."""
    from pyspark.errors import StreamingQueryException

    manifest = _open_checkpoint(ckpt, input_path, deployment, output, spark, observer, overwrite)
    files = [f for f, *_ in manifest["input"]]
    if not any(file_sizes(files)):  # no record: Spark would still run a batch 0, of no slice
        observer.note("the input holds no record")
        observer.start()
        mark_success(output, manifest["run_id"])
        return observer.finish()
    tune_gc()
    observer.note("running; the first micro-batch pays Spark's warm-up")
    observer.start()
    query, _ = start_query(spark, ckpt, output, deployment, manifest, observer, files, {"availableNow": True})
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:
        raise EngineError(f"the Spark query failed: {str(exc).strip().splitlines()[0]}") from exc
    if not ckpt.all_committed():
        raise EngineError("the Spark query stopped before the last micro-batch; run again to resume")
    mark_success(output, manifest["run_id"])
    return observer.finish()


def start_query(  # noqa: PLR0913 - the query's whole configuration
    spark,  # noqa: ANN001
    ckpt: Checkpoint,
    output: Path,
    deployment: Deployment,
    manifest: dict,
    observer: RunObserver,
    files: list[str] | SegmentFiles,
    trigger: dict,
    journal: SegmentFiles | None = None,
):  # noqa: ANN202 - (StreamingQuery, Sink)
    """Start skpub's streaming query (module docstring) over ``files``; return it and its sink.

    ``trigger`` is the keyword of ``DataStreamWriter.trigger``; with
    ``journal`` the source follows the daemon's batch journal over its
    ingest log (``files``, its segments), whose entries are records as they are.
    """
    from skpub.evaluators.spark_processor import CONTROL_DDL, EvaluatorProcessor

    # a checkpoint made before skpub recorded the partitions had one per evaluator (Spark restores its own number)
    spark.conf.set("spark.sql.shuffle.partitions", str(manifest.get("evaluator_partitions", deployment.evaluators)))
    for name in ckpt.drop_interrupted_writes():
        print(f"[skpub] removed {ckpt.query / name}: a write Spark left unfinished when it was killed", file=sys.stderr)
    deployment_json = json.dumps(deployment.to_json())
    keys, run_id, parts = manifest["evaluator_keys"], manifest["run_id"], manifest["parts"]
    spark.dataSource.register(LineSource)
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("batch_size", deployment.batch_size)
        .option("max_bytes", parts * PART_BYTES)
        .option("parts", parts)
    )
    entries = journal is not None
    if entries:
        reader = reader.option("journal", json.dumps([journal.directory, journal.name]))
        reader = reader.option("segments", json.dumps([files.directory, files.name]))
    else:
        reader = reader.option("files", json.dumps(files))
    root = str(output)
    balancer_dir = str(ckpt.balancer) if deployment.balancer.mode != "off" else ""
    located = reader.load().mapInArrow(
        ParseTask(str(ckpt.root), root, deployment_json, files, entries), ddl(PARSE_REPORT_COLUMNS)
    )
    routed = located.repartition(1).mapInArrow(
        SequencerTask(str(ckpt.root), root, run_id, deployment_json, keys, parts, files, entries),
        ddl(ROUTED_FILE_COLUMNS),
    )
    outputs = routed.groupBy("evaluator").transformWithStateInPandas(
        EvaluatorProcessor(run_id, root, deployment_json, keys, uuid.uuid4().hex, balancer_dir),
        CONTROL_DDL,
        "Append",
        "None",
    )
    sink = Sink(output, ckpt, observer, deployment, entries)
    query = (
        outputs.writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt.query)).trigger(**trigger).start()
    )
    return query, sink


DAEMON_OUTPUTS = ("deliveries", "dead_letters", "snapshots")
"""The part-file streams a daemon's batch commits to its logs (then removes, with its statistics)."""


class SparkPlane:
    """The daemon's data plane on Spark: the streaming query over the ingest log's journaled batches.

    Its checkpoint is ``DATA/spark`` and its part files go to ``DATA/output``
    (:class:`skpub.app.daemon.Daemon`). Each committed batch's deliveries,
    dead letters and snapshot lines are read from its part files, in name
    order, committed to the daemon's logs (:meth:`Daemon.commit`, exactly
    once) and removed. A restart resumes the query from its checkpoint.

    Raises
    ------
    CheckpointError
        If ``DATA/spark`` holds files skpub did not write, or a checkpoint of another format or deployment.
    JavaNotFoundError
        If no Java runtime is available.
    """

    def __init__(self, daemon, sample: Callable[[], list[bytes]]) -> None:  # noqa: ANN001 - skpub.app.daemon.Daemon
        self.daemon = daemon
        self.output = daemon.data / "output"
        self.committed = threading.Event()
        ckpt = Checkpoint(daemon.data / "spark")
        ckpt.check_owned()
        deployment = daemon.deployment
        self.spark = spark_session(daemon.master, deployment.evaluators, "skpub-serve")
        try:
            daemon.starting = "opening the Spark checkpoint"
            manifest = _open_daemon_checkpoint(ckpt, deployment, self.spark, sample)
            files = daemon.ingest.files()
            journal = daemon.batches.files()
            trigger = {"processingTime": f"{max(1, round(daemon.limits.trigger * 1000))} milliseconds"}
            tune_gc()
            daemon.starting = "starting the streaming query"
            self.query, self.sink = start_query(
                self.spark, ckpt, self.output, deployment, manifest, self, files, trigger, journal
            )
        except BaseException:
            self.spark.stop()
            raise

    @property
    def merge(self):  # noqa: ANN201 - skpub.evaluators.merge.RankedMerge or None
        """The ranked merge as of the last committed batch (None before the first)."""
        return self.sink.merged[1] if self.sink.merged is not None else None

    def on_batch(self, report: BatchReport) -> None:
        """Commit batch ``report.batch_id``'s part files to the daemon's logs, then remove them (sink observer)."""
        batch_id = report.batch_id
        produced = {
            name: [line for path in batch_parts(self.output, name, batch_id) for line in path.read_bytes().splitlines()]
            for name in DAEMON_OUTPUTS
        }
        self.daemon.commit(report, produced)
        self.daemon.metrics.observe_batch(report, self.daemon.deployment.evaluators)
        for name in (*DAEMON_OUTPUTS, "statistics"):
            for path in batch_parts(self.output, name, batch_id):
                path.unlink(missing_ok=True)
        self.committed.set()

    def check(self) -> None:
        """Raise :class:`EngineError` if the query has stopped."""
        if not self.query.isActive:
            error = self.query.exception()
            reason = str(error).strip().splitlines()[0] if error is not None else "it stopped"
            raise EngineError(f"the Spark query failed: {reason}")

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the next batch to commit."""
        self.committed.wait(seconds)
        self.committed.clear()

    def stop(self) -> None:
        """Stop the query (a batch in flight is replayed by the next start) and Spark."""
        try:
            self.query.stop()
        finally:
            self.spark.stop()


def _recorded(manifest: dict, wanted: dict) -> dict:
    """Return ``manifest``'s values of ``wanted``'s keys, its deployment as the skpub that wrote it ran it.

    A deployment key added since the manifest was written reads as skpub
    behaved before it (:func:`~skpub.kernel.config.recorded_json`).
    """
    return {k: recorded_json(manifest.get(k)) if k == "deployment" else manifest.get(k) for k in wanted}


def _open_daemon_checkpoint(  # noqa: ANN001
    ckpt: Checkpoint, deployment: Deployment, spark, sample: Callable[[], list[bytes]]
) -> dict:
    """Resume the daemon's Spark checkpoint, or create it with the initial epoch from ``sample()`` (read only then).

    Raises
    ------
    CheckpointError
        If the checkpoint was made by another skpub or for another deployment.
    """
    wanted = json.loads(json.dumps({"format": MANIFEST_FORMAT, "deployment": deployment.to_json(), "daemon": True}))
    manifest = ckpt.read_manifest()
    if manifest is not None:
        changes = deployment_changes(_recorded(manifest, wanted), wanted)
        if changes:
            raise CheckpointError(
                f"checkpoint {ckpt.root} was made by another skpub or for another deployment: {changes_text(changes)}"
            )
        return manifest
    ckpt.create()
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    EpochLog(ckpt.epochs).publish(RoutingEpoch(0, 0, initial_table(deployment, vocabulary, sample())))
    manifest = {
        **wanted,
        "run_id": uuid.uuid4().hex,
        **_evaluator_layout(spark, deployment.evaluators),
        "parts": parse_parallelism(spark),
    }
    for folder in (ckpt.router, ckpt.merge, ckpt.balancer):
        folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ckpt.manifest, json.dumps(manifest))
    return manifest
