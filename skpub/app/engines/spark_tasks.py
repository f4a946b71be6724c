"""The Spark engine's routing tasks: parallel parse, then the serial sequencer.

``ParseTask`` runs in one task per slice of the micro-batch (``mapInArrow``
over skpub's source, :mod:`skpub.app.engines.source`): it reads the slice's
records from the input files, parses, validates, normalizes and locates
them (:class:`~skpub.router.locate.Locator`), writes their dead letters
straight to the output (``dead_letters/part-<batch>-p<part>.jsonl``),
writes the located records (:data:`skpub.kernel.wire.LOCATED_COLUMNS`) to a
file in the checkpoint (``located/``, Arrow IPC) and emits one report row
that names it.

``SequencerTask`` runs in the one task after ``repartition(1)``, which hands
the batch to the sequencer's host (:mod:`skpub.app.engines.sequencer_host`:
one sequencer per executor JVM, kept between batches) or runs it itself
when the host cannot: it reads the parts' records in stream order, runs the :class:`~skpub.router.sequencer.Sequencer`
on their compact columns (kind, id, owner, terms; targets and keywords of
subscriptions), and writes each evaluator's routed rows to a file
(``routed/``), taking them from the parsed columns (Arrow ``take``: the
records are never rebuilt as Python objects here); it emits one row per
evaluator naming its file. Rows travel through files rather than Spark's
shuffles because Spark's conversions of a batch's rows to its own format,
and to pandas for the stateful evaluators, cost about as much as applying
them (DESIGN "The Spark engine"). It saves the id registry's changes (and every
``ROUTER_BASE_EVERY`` batches the whole registry, a base) under the batch id,
writes its own dead letters (``part-<batch>-s.jsonl``) and the batch's
routing report for the driver.

Both are deterministic functions of the input's slices, the published epochs
and the registry before the batch, so a replayed batch rewrites the same
files.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from skpub.app.checkpoint import Checkpoint, newest_base
from skpub.app.journal import SegmentFiles
from skpub.kernel.config import Deployment, deployment_from_text
from skpub.kernel.errors import CheckpointError, InputError
from skpub.kernel.host import HostAddress, HostError, exchange, recv_message, send_message, use_hosts, watched_pid
from skpub.kernel.parts import write_lines, write_part
from skpub.kernel.records import DeadLetter, position_index, stream_position
from skpub.kernel.registry import IdRegistry
from skpub.kernel.runtime import tune_gc
from skpub.kernel.slices import Slice, slice_lines
from skpub.kernel.storage import atomic_write_bytes, atomic_write_text
from skpub.kernel.text import load_vocabulary
from skpub.kernel.transfer import read_handoffs, read_plan
from skpub.kernel.wire import (
    LOCATED_SCHEMA,
    ROUTED_FILE_COLUMNS,
    arrow_schema,
    bytes_table,
    read_rows_file,
    table_bytes,
)
from skpub.router.dispatch import accepted_controls, marks, rejected_letters
from skpub.router.epoch import EpochLog
from skpub.router.locate import Locator
from skpub.router.sequencer import Sequencer, evaluator_tables, routed_table
from skpub.router.state import decode_journal, decode_registry, encode_journal, registry_buffers

ROUTER_BASE_EVERY = 16
"""Every this many micro-batches the whole registry is saved (a base; deltas in between)."""


def _task_batch_id() -> int:
    """Return the running Spark task's micro-batch id.

    Imported at the call: the sequencer's host imports this module and runs
    no Spark task, so it does not load pyspark (about 0.25 s and 9 MiB of
    each host's start).
    """
    from skpub.evaluators.spark_processor import current_batch_id

    return current_batch_id()


class ParseTask:
    """The ``mapInArrow`` function of the parse stage: one slice of the input per input row.

    ``files`` are the input's files in stream order (the source's option):
    the task reads its slice's records from them
    (:func:`~skpub.kernel.slices.slice_lines`; ``entries``: they are the
    segments of the daemon's ingest log, whose entries are records as they
    are, :class:`~skpub.app.journal.SegmentFiles`).
    """

    def __init__(
        self,
        checkpoint_root: str,
        output_root: str,
        deployment_json: str,
        files: list[str] | SegmentFiles,
        entries: bool = False,
    ) -> None:
        self.checkpoint_root = checkpoint_root
        self.output_root = output_root
        self.deployment_json = deployment_json
        self.files = files
        self.entries = entries

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Parse and locate each part's lines; write its located rows to a file; yield a report row per part.

        The rows go through a file in the checkpoint, as the routed rows do
        (:meth:`SequencerTask.__call__`); the report names it.
        """
        checkpoint = Checkpoint(self.checkpoint_root)
        tune_gc()
        batch_id = _task_batch_id()
        deployment = deployment_from_text(self.deployment_json)
        vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
        epoch = EpochLog(checkpoint.epochs).for_batch(batch_id)
        locator = Locator(deployment, vocabulary, epoch.table)
        for batch in batches:
            for raw in batch.column("slice").to_pylist():
                start = time.thread_time()
                piece = _slice(raw)
                lines = _lines(self.files, piece, self.entries)
                part, first = piece.part, piece.first
                located = locator.locate_items(lines, batch_id, epoch.number, first)
                rows = located.items
                rows_file = checkpoint.located_file(batch_id, part)
                atomic_write_bytes(rows_file, table_bytes(rows))
                letters = located.dead_letters
                dead = (d.to_json(self.entries) for d in letters)  # the daemon's name their positions
                write_part(self.output_root, "dead_letters", batch_id, dead, f"p{part:03d}")
                report = {
                    "part": part,
                    "first": first,
                    "lines": len(lines),
                    "bytes": sum(map(len, lines)) + len(lines),
                    "dead_letters": Counter(d.reason for d in letters),
                    "cpu_seconds": time.thread_time() - start,
                    "path": str(rows_file),
                    "rows": rows.num_rows,
                    "slice": raw,
                }
                yield pa.RecordBatch.from_pydict({"report": [json.dumps(report)]}, schema=PARSE_REPORT_SCHEMA)


PARSE_REPORT_COLUMNS: tuple[tuple[str, str], ...] = (("report", "string"),)
"""What a parse task yields per staged part: its report (JSON), which names the file of its located rows."""
PARSE_REPORT_SCHEMA = arrow_schema(PARSE_REPORT_COLUMNS)
ROUTED_FILE_SCHEMA = arrow_schema(ROUTED_FILE_COLUMNS)


class SequencerTask:
    """The ``mapInArrow`` function of the serial stage, after ``repartition(1)``: one micro-batch."""

    def __init__(
        self,
        checkpoint_root: str,
        output_root: str,
        run_id: str,
        deployment_json: str,
        keys: list[int],
        parts: int,
        files: list[str] | SegmentFiles,
        entries: bool = False,
    ) -> None:
        self.checkpoint_root = checkpoint_root
        self.files = files
        self.entries = entries
        self.output_root = output_root
        self.run_id = run_id
        self.deployment_json = deployment_json
        self.keys = keys
        self.parts = parts
        self.hosts = use_hosts()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Sequence the micro-batch (in the sequencer's host if it can), yield the routed rows' files.

        The host (:mod:`skpub.app.engines.sequencer_host`) keeps the
        sequencer between micro-batches whichever Python worker Spark picks;
        when hosts are off, or the host fails, the worker runs :meth:`run`
        itself (the same files: a run is a function of the checkpoint).
        """
        tune_gc()
        batch_id = _task_batch_id()
        table = pa.Table.from_batches(list(batches), schema=PARSE_REPORT_SCHEMA)
        outcome = None
        if self.hosts:
            try:
                outcome = self._via_host(batch_id, table)
            except Exception as exc:  # noqa: BLE001 - whatever the host did, the worker can sequence the batch
                print(f"skpub: the sequencer runs batch {batch_id} in its worker: {exc}", file=sys.stderr)
        routed, letters = self.run(batch_id, table) if outcome is None else outcome
        write_lines(self.output_root, "dead_letters", batch_id, letters, "s")  # the task's, never the host's
        yield from routed.to_batches()

    def to_json(self) -> dict:
        """Return the task's arguments as JSON (what its host needs to run it)."""
        files = self.files
        where = {"segments": [files.directory, files.name]} if isinstance(files, SegmentFiles) else {"files": files}
        return {
            "checkpoint_root": self.checkpoint_root,
            "output_root": self.output_root,
            "run_id": self.run_id,
            "deployment_json": self.deployment_json,
            "keys": self.keys,
            "parts": self.parts,
            "entries": self.entries,
            **where,
        }

    @classmethod
    def from_json(cls, raw: dict) -> SequencerTask:
        """Rebuild a task from :meth:`to_json` output (a host's request; ``KeyError`` or ``TypeError`` if damaged)."""
        files = SegmentFiles(*raw["segments"]) if "segments" in raw else [str(f) for f in raw["files"]]
        return cls(
            str(raw["checkpoint_root"]),
            str(raw["output_root"]),
            str(raw["run_id"]),
            str(raw["deployment_json"]),
            [int(k) for k in raw["keys"]],
            int(raw["parts"]),
            files,
            bool(raw["entries"]),
        )

    def _via_host(self, batch_id: int, table: pa.Table) -> tuple[pa.Table, bytes]:
        """Run the batch in the sequencer's host; return its answer (as :meth:`run`'s).

        Raises
        ------
        HostError
            If the host cannot be reached or fails.
        """
        with exchange(sequencer_host_address()) as sock:
            send_message(sock, {"op": "sequence", "batch_id": batch_id, "task": self.to_json()}, [table_bytes(table)])
            header, blobs = recv_message(sock)
        if header.get("status") != "ok" or len(blobs) != 2:
            raise HostError(f"the sequencer host failed: {header.get('message')}")
        return _table_of(blobs[0], ROUTED_FILE_SCHEMA), blobs[1]

    def run(self, batch_id: int, table: pa.Table, hosted: bool = False) -> tuple[pa.Table, bytes]:
        """Sequence micro-batch ``batch_id`` (``table``: the parse reports), write each evaluator's routed rows.

        Returns their files (:data:`ROUTED_FILE_COLUMNS`) and the sequencer's
        dead letters as part-file bytes, which the task writes to the output
        (a host writes only in the checkpoint, so one outliving its task
        leaves nothing in the output). The rows
        (:data:`ROUTED_SCHEMA`) go to a file per evaluator in the checkpoint
        (Arrow IPC, written atomically; a replay of the batch writes the
        same rows again) rather than through Spark's shuffle: Spark's
        conversions of a hundred thousand rows to its own format and to
        pandas cost about as much as applying them (DESIGN "The Spark
        engine"). The sequencer stays in this process's cache for the next
        batch; ``hosted`` (run by the sequencer's host) goes to the routing
        report.
        """
        start = time.thread_time()
        items, reports = _in_stream_order(table, self.parts, batch_id)
        checkpoint = Checkpoint(self.checkpoint_root)
        epoch = EpochLog(checkpoint.epochs).for_batch(batch_id)
        deployment = deployment_from_text(self.deployment_json)
        restore = time.thread_time()
        sequencer = _sequencer_before(checkpoint, self.run_id, deployment, batch_id)
        restore = time.thread_time() - restore
        balancing = deployment.balancer.mode != "off"
        placements = _rehome(checkpoint, sequencer, batch_id) if balancing else 0
        decisions = sequencer.sequence_table(items, epoch.table.partitioning)
        end = stream_position(batch_id, sum(r["lines"] for r in reports))
        routed = routed_table(items, decisions, self.keys, end)
        rejected = _rejected_letters(self.files, reports, items, decisions, self.entries)
        letters = b"".join(orjson.dumps(d.to_json(self.entries)) + b"\n" for d in rejected)
        atomic_write_bytes(checkpoint.router_file("delta", batch_id), encode_journal(sequencer.registry.take_journal()))
        if batch_id % ROUTER_BASE_EVERY == ROUTER_BASE_EVERY - 1:
            atomic_write_bytes(checkpoint.router_file("base", batch_id), registry_buffers(sequencer.registry))
        dead = Counter(d.reason for d in rejected)
        for r in reports:
            dead.update(r["dead_letters"])
        report = {
            "records": sum(r["lines"] for r in reports),
            "bytes": sum(r.get("bytes", 0) for r in reports),
            "objects": decisions.objects,
            "forwarded": decisions.forwarded,
            "dead_letters": dead,
            "parse_cpu_seconds": sum(r["cpu_seconds"] for r in reports),
            "sequencer_cpu_seconds": time.thread_time() - start,
            "restore_cpu_seconds": restore,
            "epoch": epoch.number,
            "marks": marks(decisions, items, end),
            "controls": accepted_controls(decisions, items),
            "placements": placements,
            "hosted": hosted,
        }
        atomic_write_text(checkpoint.router_report(batch_id), json.dumps(report))
        files = _write_routed(checkpoint, batch_id, routed, self.keys, every=balancing)
        _SEQUENCERS.clear()  # one run's sequencer per process: each holds its object-id horizon (80 MiB by default)
        _SEQUENCERS[self.run_id] = (batch_id, sequencer)
        partitioning = epoch.table.partitioning
        routed_files = pa.Table.from_pydict(
            {
                "evaluator": [self.keys[e] for e in files],
                "path": [str(path) for path, _ in files.values()],
                "rows": [rows for _, rows in files.values()],
                "partition": [json.dumps(partitioning.boxes_of(e)) if balancing else "" for e in files],
            },
            schema=ROUTED_FILE_SCHEMA,
        )
        return routed_files, letters


_SEQUENCERS: dict[str, tuple[int, Sequencer]] = {}
"""Run id -> (last batch sequenced, the sequencer after it), in the host or the worker that ran it (one run)."""


def _table_of(blob: bytes, schema: pa.Schema) -> pa.Table:
    """Return the Arrow IPC stream ``blob`` as a table of ``schema``.

    Raises
    ------
    HostError
        If it is not an Arrow IPC stream of that schema.
    """
    try:
        table = bytes_table(blob)
    except ValueError as exc:
        raise HostError(str(exc)) from None
    if table.schema != schema:
        raise HostError(f"a table of schema {table.schema}, not {schema}")
    return table


def sequencer_host_address() -> HostAddress:
    """Return the address of the sequencer's host for this executor (:mod:`skpub.app.engines.sequencer_host`)."""
    return HostAddress("sequencer", watched_pid(), "skpub.app.engines.sequencer_host")


def sequencer_host_handler() -> Callable[[socket.socket], None]:
    """Return the request handler of the sequencer's host: it runs :meth:`SequencerTask.run` on each request.

    The request is ``{"op": "sequence", "batch_id": b, "task": SequencerTask.to_json()}``
    with the parse reports as one Arrow IPC blob; the answer ``{"status":
    "ok"}`` with the routed files (Arrow IPC) and the dead letters (part-file
    bytes, which the task writes) as two blobs, or ``{"status": "error",
    "message": ...}`` (the worker then sequences the batch itself).
    """

    def handle(conn: socket.socket) -> None:
        tune_gc()
        try:
            header, blobs = recv_message(conn)
            if header.get("op") != "sequence" or len(blobs) != 1:
                raise HostError(f"not a sequencer request: {header.get('op')!r} with {len(blobs)} blobs")
            table = _table_of(blobs[0], PARSE_REPORT_SCHEMA)
            routed, letters = SequencerTask.from_json(header["task"]).run(int(header["batch_id"]), table, hosted=True)
            send_message(conn, {"status": "ok"}, [table_bytes(routed), letters])
        except Exception as exc:  # noqa: BLE001 - the worker sequences the batch itself
            with contextlib.suppress(OSError):
                send_message(conn, {"status": "error", "message": f"{type(exc).__name__}: {exc}"})

    return handle


def _write_routed(
    checkpoint: Checkpoint, batch_id: int, routed: pa.Table, keys: list[int], every: bool = False
) -> dict[int, tuple[Path, int]]:
    """Write each evaluator's routed rows (stream order kept) to its file; return evaluator index -> (file, rows).

    Only evaluators with rows get a file, as only they had rows to group,
    unless ``every`` (the balancer is on: every evaluator reports its load,
    and hands off or takes over, at every batch).
    """
    files = {}
    for e, rows in enumerate(evaluator_tables(routed, keys)):
        if rows.num_rows or every:
            path = checkpoint.routed_file(batch_id, e)
            atomic_write_bytes(path, table_bytes(rows))
            files[e] = (path, rows.num_rows)
    return files


def _rehome(checkpoint: Checkpoint, sequencer: Sequencer, batch_id: int) -> int:
    """Move the placements of a transfer completing at micro-batch ``batch_id`` (none: 0); return how many changed.

    Raises
    ------
    CheckpointError
        If the plan or a hand-off is damaged or missing.
    """
    try:
        plan = read_plan(checkpoint.balancer, batch_id - 2)
        if plan is None:
            return 0
        return sequencer.rehome(read_handoffs(checkpoint.balancer, plan))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


def _check_complete(reports: list[dict], parts: int, batch_id: int) -> None:
    """Check that the parse reports cover every part of the batch and every line, without gap or overlap.

    Raises
    ------
    CheckpointError
        If a part is missing or repeated, or their lines do not tile the batch.
    """
    reports = sorted(reports, key=lambda r: r["part"])
    if [r["part"] for r in reports] != list(range(parts)):
        raise CheckpointError(f"micro-batch {batch_id} got parts {[r['part'] for r in reports]}, not 0..{parts - 1}")
    expected = 0
    for r in reports:
        if r["first"] != expected:
            raise CheckpointError(
                f"micro-batch {batch_id}: part {r['part']} starts at line {r['first']}, not {expected}"
            )
        expected += r["lines"]


def _in_stream_order(table: pa.Table, parts: int, batch_id: int) -> tuple[pa.Table, list[dict]]:
    """Return the batch's located rows in stream order, read from the files the parse reports name, and the reports.

    The shuffle delivers the reports (:data:`PARSE_REPORT_SCHEMA` rows) in
    any order; once they are checked to tile the batch
    (:func:`_check_complete`), the parts' rows are joined in order of
    ``part`` without copying; a full sort is the fallback should positions
    ever be out of order within a part.

    Raises
    ------
    CheckpointError
        If the parts do not tile the batch, or a part's file is missing, is
        not Arrow or does not hold the rows its report counts.
    """
    reports = sorted((json.loads(raw) for raw in table.column("report").to_pylist()), key=lambda r: r["part"])
    _check_complete(reports, parts, batch_id)
    tables = []
    for r in reports:
        try:
            tables.append(read_rows_file(r["path"], r["rows"], "located rows", f"part {r['part']}"))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    items = pa.concat_tables(tables) if tables else LOCATED_SCHEMA.empty_table()
    order = items.column("pos").to_numpy()
    if len(order) > 1 and not (np.diff(order) > 0).all():
        items = items.take(pc.sort_indices(items.column("pos")))
    return items.combine_chunks(), reports


def _rejected_letters(  # noqa: ANN001
    files: list[str] | SegmentFiles, reports: list[dict], items: pa.Table, decisions, entries: bool = False
) -> list[DeadLetter]:
    """Dead letters of the sequencer's rejections, with their input lines read back from the parts' slices."""
    if not decisions.rejected:
        return []
    lines: dict[int, bytes] = {}
    for r in reports:
        piece = _slice(r["slice"])
        lines.update(enumerate(_lines(files, piece, entries), start=piece.first))
    return rejected_letters(decisions, items.column("pos"), lambda pos: lines[position_index(pos)])


def _slice(raw: str) -> Slice:
    """Decode a source row's slice.

    Raises
    ------
    CheckpointError
        If it is not one (a checkpoint of another skpub).
    """
    try:
        return Slice.from_json(raw)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


def _lines(files: list[str] | SegmentFiles, piece: Slice, entries: bool = False) -> list[bytes]:
    """Read a slice's records from the input.

    Raises
    ------
    InputError
        If the input changed since the micro-batch was planned.
    """
    try:
        return slice_lines(files if entries else [Path(f) for f in files], piece, entries)
    except (OSError, ValueError) as exc:
        raise InputError(f"the input changed during the run: {exc}") from None


def _sequencer_before(checkpoint: Checkpoint, run_id: str, deployment: Deployment, batch_id: int) -> Sequencer:
    """Return the sequencer state after micro-batch ``batch_id - 1``.

    From this worker's cache when it holds that state; caught up from the
    cache by the deltas of the batches it missed when it holds an older one
    (the sequencer task runs in whichever Python worker is free, so a worker
    often misses a batch or two); else rebuilt from the newest registry
    base before ``batch_id`` plus the deltas after it (summaries derived
    from the registry's placements). The cache entry is taken out:
    sequencing mutates the state, so an attempt that fails midway must not
    leave a half-applied state for its retry.

    Raises
    ------
    CheckpointError
        If a delta the rebuild needs is missing or damaged.
    """
    cached = _SEQUENCERS.pop(run_id, None)
    deltas = checkpoint.router_files("delta")
    if cached is not None and cached[0] < batch_id and all(b in deltas for b in range(cached[0] + 1, batch_id)):
        version, sequencer = cached
        for b in range(version + 1, batch_id):
            sequencer.replay(*decode_journal(deltas[b].read_bytes()))
        return sequencer
    bases = checkpoint.router_files("base")
    base = newest_base(bases, batch_id)
    if base >= 0:
        registry = decode_registry(bases[base].read_bytes())
    else:
        registry = IdRegistry(deployment.object_id_horizon)
    for b in range(base + 1, batch_id):
        if b not in deltas:
            raise CheckpointError(f"router changes of batch {b} are missing from {checkpoint.router}")
        objects, changes = decode_journal(deltas[b].read_bytes())
        registry.replay_objects(objects)
        registry.replay(changes)
    registry.journal = []
    return Sequencer(deployment.evaluators, registry, deployment.window)


PART_BYTES = 256 << 20
"""Bytes per parse task a micro-batch aims under: the source cuts a batch at ``parts x PART_BYTES``."""
