"""The Spark engine: Structured Streaming with executor-resident evaluators.

Query shape (DESIGN "The Spark engine")::

    text file source (one staged chunk per micro-batch)
      -> coalesce(1).mapInArrow(RouterTask)       routing unit, epoch by batch id
      -> groupBy(evaluator).transformWithStateInPandas(EvaluatorProcessor)
                                                  RocksDB state, hot index cache
      -> foreachBatch(Sink)                       idempotent per batch id

The checkpoint directory holds everything a restart needs: the staged input
chunks (``source/``), the routing epochs (``epochs/``), the router's id
registry (``router/``: each micro-batch's changes, and a full snapshot every
``ROUTER_SNAPSHOT_EVERY`` batches, so a batch writes O(batch) bytes, not
O(stream)), the evaluator grouping keys and the deployment
(``manifest.json``), and Spark's own query checkpoint (``query/``). A run
killed at any point and started again with the same arguments resumes from
the last committed micro-batch and ends with exactly the same output.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from skpub.app.checkpoint import CHECKPOINT_DIR, Checkpoint
from skpub.app.engines.sink import write_batch
from skpub.app.output import claim_output, inspect_output, mark_success
from skpub.app.summary import BatchReport, RunObserver, RunSummary
from skpub.kernel.config import Deployment, deployment_from_text
from skpub.kernel.errors import CheckpointError, EngineError, InputError, JavaNotFoundError
from skpub.kernel.inputs import STDIN, batches, input_files, iter_lines, take_sample
from skpub.kernel.records import DeadLetter
from skpub.kernel.registry import IdRegistry
from skpub.kernel.runtime import tune_gc
from skpub.kernel.storage import atomic_write_bytes, atomic_write_text
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import COLUMNS, ddl, to_columns
from skpub.router.dispatch import Router
from skpub.router.epoch import EpochLog, RoutingEpoch
from skpub.router.initial import initial_table
from skpub.router.state import decode_journal, decode_snapshot, encode_journal, encode_snapshot

ROUTER_SNAPSHOT_EVERY = 16
CHUNK_HEADER = b"skpub-chunk-v1"
"""First line of every staged chunk; never a record (see :func:`stage_input`)."""
DRIVER_JAVA_OPTIONS = "-XX:+UseSerialGC"
"""The driver JVM (which hosts the executors in local mode) uses the serial collector.

Measured with ``benchmarks/memory.py`` on 2 cores: under G1 the JVM's resident
memory kept growing with the number of micro-batches (860 MiB after 200k
objects, 1,380 MiB after 2M, live data constant), because G1 expands the heap
to meet its pause-time goals; the serial collector sizes the heap by live
data (670 vs 733 MiB) so memory stays flat as the stream grows.
"""


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
        .config("spark.sql.shuffle.partitions", str(evaluators))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )  # fmt: skip


def _input_fingerprint(input_path: str | Path) -> list:
    """Name, size and SHA-256 of every input file: a restart must read the same stream."""
    out = []
    for f in input_files(input_path):
        digest = hashlib.sha256()
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
        out.append([f.name, f.stat().st_size, digest.hexdigest()])
    return out


def stage_input(input_path: str | Path, checkpoint: Checkpoint, batch_size: int) -> int:
    r"""Copy the input into ``batch_size``-line chunks, one per micro-batch; return their count.

    Chunk ``i`` gets modification time ``base + i`` seconds, so the file source
    (one file per trigger) takes them in stream order. Lines are copied as
    bytes, exactly as read (BOM and ``\r\n`` handled by
    :func:`skpub.kernel.inputs.read_records`); the query reads them back with
    ``lineSep = "\n"`` as binary, so Spark never decodes them. Each chunk
    starts with the line :data:`CHUNK_HEADER`, which the router drops: Hadoop's
    line reader strips a byte-order mark at the start of a file, and the
    first record of a chunk may begin with one (then it is ``malformed_json``).
    """
    checkpoint.source.mkdir(parents=True, exist_ok=True)
    chunks = 0
    base = 1_000_000_000
    for chunks, lines in enumerate(batches(iter_lines(input_path), batch_size), start=1):
        path = checkpoint.source / f"chunk-{chunks - 1:08d}.raw"
        atomic_write_bytes(path, b"\n".join((CHUNK_HEADER, *lines)) + b"\n")
        os.utime(path, (base + chunks, base + chunks))
    return chunks


def evaluator_keys(spark, evaluators: int) -> list[int]:  # noqa: ANN001
    """Return one grouping-key value per evaluator, each hashed by Spark to its own partition.

    Spark places a key in shuffle partition ``pmod(hash(key), n)``; small
    consecutive ids collide (DESIGN), so search for values that cover every
    partition once.
    """
    rows = (
        spark.range(0, 64 * evaluators + 64)
        .selectExpr("cast(id as int) as k", f"pmod(hash(cast(id as int)), {evaluators}) as p")
        .collect()
    )
    keys: dict[int, int] = {}
    for row in rows:
        keys.setdefault(row.p, row.k)
    return [keys[p] for p in range(evaluators)]


class RouterTask:
    """The ``mapInArrow`` function: one routing unit per micro-batch.

    Reads every line of the batch (one partition after ``coalesce(1)``), puts
    them in stream order (file, block, line), picks the epoch in force for the
    batch id, routes them from the router state after the previous batch, and
    saves the id registry's changes (and every ``ROUTER_SNAPSHOT_EVERY``
    batches the whole registry) and the counters under the batch id.
    """

    def __init__(self, checkpoint_root: str, run_id: str, deployment_json: str, keys: list[int]) -> None:
        self.checkpoint_root = checkpoint_root
        self.run_id = run_id
        self.deployment_json = deployment_json
        self.keys = keys

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Route the micro-batch's lines; yield the routed rows in the wire format."""
        from skpub.evaluators.spark_processor import current_batch_id

        tune_gc()
        batch_id = current_batch_id()
        table = pa.Table.from_batches(list(batches))
        lines = _ordered_lines(table)
        checkpoint = Checkpoint(self.checkpoint_root)
        deployment = deployment_from_text(self.deployment_json)
        vocabulary = load_vocabulary(deployment.vocabulary)
        router = _router_before(checkpoint, self.run_id, deployment, vocabulary, batch_id)
        epoch = EpochLog(checkpoint.epochs).for_batch(batch_id)
        routed = router.route_many(lines, batch_id, epoch)
        changes = router.registry.take_journal()
        atomic_write_bytes(checkpoint.router_delta(batch_id), encode_journal(changes))
        if batch_id % ROUTER_SNAPSHOT_EVERY == ROUTER_SNAPSHOT_EVERY - 1:
            atomic_write_bytes(checkpoint.router_snapshot(batch_id), encode_snapshot(router.registry))
        report = {
            "records": len(lines),
            "objects": routed.objects,
            "forwarded": routed.forwarded,
            "routing_seconds": routed.routing_seconds,
            "epoch": epoch.number,
        }
        atomic_write_text(checkpoint.router_report(batch_id), json.dumps(report))
        _ROUTERS[self.run_id] = (batch_id, router)
        columns = to_columns(routed.rows, self.keys)
        yield pa.RecordBatch.from_pydict(columns, schema=_wire_schema())


_ROUTERS: dict[str, tuple[int, Router]] = {}


_ARROW_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "string": pa.string(),
    "array<string>": pa.list_(pa.string()),
    "array<double>": pa.list_(pa.float64()),
}


def _wire_schema() -> pa.Schema:
    """Return the Arrow schema of :data:`skpub.kernel.wire.COLUMNS`."""
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS])


def _ordered_lines(table: pa.Table) -> list[bytes]:
    """Return the lines in stream order (by file, then block, then position), without the chunk headers.

    Raises
    ------
    CheckpointError
        If a staged chunk does not start with :data:`CHUNK_HEADER`.
    """
    values = table.column("value").to_pylist()
    files, starts = table.column("file_path"), table.column("file_block_start")
    files_list, starts_list = files.to_pylist(), starts.to_pylist()
    order: Iterable[int] = range(len(values))
    if len(files.unique()) > 1 or len(starts.unique()) > 1:
        order = sorted(order, key=lambda i: (files_list[i], starts_list[i], i))
    lines, current = [], None
    for i in order:
        if starts_list[i] == 0 and files_list[i] != current:
            current = files_list[i]
            if values[i] != CHUNK_HEADER:
                raise CheckpointError(f"staged chunk {current} does not start with skpub's chunk header")
            continue
        lines.append(values[i])
    return lines


def _router_before(checkpoint: Checkpoint, run_id: str, deployment: Deployment, vocabulary, batch_id: int) -> Router:  # noqa: ANN001
    """Return the router state after micro-batch ``batch_id - 1``.

    From the executor cache when it holds exactly that state, else rebuilt
    from the newest registry snapshot before ``batch_id`` plus the deltas
    after it (summaries are derived from the registry's placements).

    The cache entry is taken out: routing mutates the router, so an attempt
    that fails midway must not leave a half-applied router for its retry.
    """
    cached = _ROUTERS.pop(run_id, None)
    if cached is not None and cached[0] == batch_id - 1:
        return cached[1]
    snapshots = [b for b in checkpoint.router_files("snapshot") if b < batch_id]
    base = max(snapshots, default=-1)
    if base >= 0:
        registry = decode_snapshot(checkpoint.router_snapshot(base).read_bytes())
    else:
        registry = IdRegistry(deployment.object_id_horizon)
    deltas = checkpoint.router_files("delta")
    for b in range(base + 1, batch_id):
        if b not in deltas:
            raise CheckpointError(f"router changes of batch {b} are missing from {checkpoint.router}")
        registry.replay(decode_journal(deltas[b].read_bytes()))
    registry.journal = []
    return Router(deployment, vocabulary, registry)


class Sink:
    """The ``foreachBatch`` sink: writes one micro-batch's outputs, idempotent per batch id."""

    def __init__(self, output: Path, checkpoint: Checkpoint, observer: RunObserver) -> None:
        self.output = output
        self.checkpoint = checkpoint
        self.observer = observer

    def __call__(self, frame, batch_id: int) -> None:  # noqa: ANN001
        """Collect the micro-batch's evaluator outputs and write them under ``batch_id``."""
        table = frame.toArrow()
        cols = {name: table.column(name).to_pylist() for name in table.column_names}
        deliveries, dead, statistics = [], [], []
        for i, kind in enumerate(cols["kind"]):
            if kind == "delivery":
                deliveries.append((cols["pos"][i], cols["sub"][i], cols["obj"][i]))
            elif kind == "dead_letter":
                dead.append(DeadLetter(cols["pos"][i], cols["line"][i], cols["reason"][i], cols["message"][i]))
            else:
                statistics.append(json.loads(cols["payload"][i]))
        statistics.sort(key=lambda row: row["evaluator"])
        routing = json.loads(self.checkpoint.router_report(batch_id).read_text())
        report = BatchReport(batch_id, **routing)
        write_batch(self.output, batch_id, [deliveries], dead, statistics, report)
        self._prune_router_files(batch_id)
        self.observer.on_batch(report)

    def _prune_router_files(self, batch_id: int) -> None:
        """Drop registry files no restart can need once ``batch_id`` is written.

        A replay of ``batch_id`` itself needs the newest snapshot before it and
        every delta after that snapshot; everything older goes.
        """
        snapshots = self.checkpoint.router_files("snapshot")
        keep = max((b for b in snapshots if b < batch_id), default=-1)
        for b, path in snapshots.items():
            if b < keep:
                path.unlink(missing_ok=True)
        for b, path in self.checkpoint.router_files("delta").items():
            if b <= keep:
                path.unlink(missing_ok=True)


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
        if {k: manifest.get(k) for k in wanted} != wanted and not overwrite:
            raise CheckpointError(
                f"checkpoint {checkpoint.root} was made for another input or deployment; "
                "pass --overwrite to replace that run, or another --checkpoint"
            )
        if not overwrite and state.run_id == manifest.get("run_id"):
            claim_output(output, manifest["run_id"], overwrite, resume=True)
            observer.note(f"resuming from checkpoint {checkpoint.root}")
            return manifest
    run_id = uuid.uuid4().hex
    claim_output(output, run_id, overwrite)
    checkpoint.create()
    vocabulary = load_vocabulary(deployment.vocabulary)
    table = initial_table(deployment, vocabulary, take_sample(iter_lines(input_path), deployment.sample_size))
    EpochLog(checkpoint.epochs).publish(RoutingEpoch(0, 0, table))
    chunks = stage_input(input_path, checkpoint, deployment.batch_size)
    observer.note(f"staged the input as {chunks} micro-batches of up to {deployment.batch_size} records")
    manifest = {
        **wanted,
        "run_id": run_id,
        "evaluator_keys": evaluator_keys(spark, deployment.evaluators),
        "chunks": chunks,
    }
    checkpoint.router.mkdir(parents=True, exist_ok=True)
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
        If the input is missing or empty, or is standard input.
    """
    from pyspark.errors import StreamingQueryException

    from skpub.evaluators.spark_processor import OUTPUT_DDL, EvaluatorProcessor

    if str(input_path) == STDIN:
        raise InputError("the Spark engine reads files (it stages and fingerprints them); use --engine local for -")
    if not all(f.is_file() for f in input_files(input_path)):
        raise InputError(f"the Spark engine reads regular files, and {input_path} is not one; use --engine local")
    output = Path(output_dir).absolute()
    ckpt = Checkpoint(checkpoint or output / CHECKPOINT_DIR)
    inspect_output(output)
    ckpt.check_owned()
    own_session = spark is None
    if own_session:
        observer.note(f"starting Spark on {master}")
        spark = spark_session(master, deployment.evaluators)
    spark.conf.set("spark.sql.shuffle.partitions", str(deployment.evaluators))
    try:
        manifest = _open_checkpoint(ckpt, input_path, deployment, output, spark, observer, overwrite)
        deployment_json = json.dumps(deployment.to_json())
        keys = manifest["evaluator_keys"]
        lines = (
            spark.readStream.format("text")
            .option("maxFilesPerTrigger", 1)
            .option("lineSep", "\n")
            .load(str(ckpt.source))
            .selectExpr(
                "cast(value as binary) as value",
                "_metadata.file_path as file_path",
                "_metadata.file_block_start as file_block_start",
            )
        )
        run_id = manifest["run_id"]
        routed = lines.coalesce(1).mapInArrow(RouterTask(str(ckpt.root), run_id, deployment_json, keys), ddl())
        outputs = routed.groupBy("evaluator").transformWithStateInPandas(
            EvaluatorProcessor(run_id, deployment_json, keys),
            OUTPUT_DDL,
            "Append",
            "None",
        )
        tune_gc()
        observer.note("running; the first micro-batch pays Spark's warm-up")
        observer.start()
        query = (
            outputs.writeStream.foreachBatch(Sink(output, ckpt, observer))
            .option("checkpointLocation", str(ckpt.query))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            raise EngineError(f"the Spark query failed: {str(exc).strip().splitlines()[0]}") from exc
        if not ckpt.all_committed():
            raise EngineError("the Spark query stopped before the last micro-batch; run again to resume")
        mark_success(output, run_id)
    finally:
        if own_session:
            spark.stop()
    return observer.finish()
