"""The Spark engine's routing tasks: parallel parse, then the serial sequencer.

``ParseTask`` runs in one task per staged part file (``mapInArrow`` over the
``binaryFile`` source): it parses, validates, normalizes and locates its
lines (:class:`~skpub.router.locate.Locator`), writes their dead letters
straight to the output (``dead_letters/part-<batch>-p<part>.jsonl``) and
emits the located records in the columns of
:data:`skpub.kernel.wire.LOCATED_COLUMNS`, plus one report row.

``SequencerTask`` runs in the one task after ``repartition(1)``: it puts the
records in stream order, runs the :class:`~skpub.router.sequencer.Sequencer`
on their compact columns (kind, id, owner, terms; targets and keywords of
subscriptions), and emits the routed rows by taking them from the parsed
columns (Arrow ``take``: the records are never rebuilt as Python objects
here). It saves the id registry's changes (and every
``ROUTER_SNAPSHOT_EVERY`` batches the whole registry) under the batch id,
writes its own dead letters (``part-<batch>-s.jsonl``) and the batch's
routing report for the driver.

Both are deterministic functions of the staged input, the published epochs
and the registry before the batch, so a replayed batch rewrites the same
files.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from skpub.app.checkpoint import Checkpoint
from skpub.evaluators.spark_processor import current_batch_id
from skpub.kernel.config import Deployment, deployment_from_text
from skpub.kernel.errors import CheckpointError
from skpub.kernel.parts import write_part
from skpub.kernel.records import DeadLetter, position_index, stream_position
from skpub.kernel.registry import IdRegistry
from skpub.kernel.runtime import tune_gc
from skpub.kernel.storage import atomic_write_bytes, atomic_write_text
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import LOCATED_SCHEMA, REPORT
from skpub.router.dispatch import marks, rejected_letters
from skpub.router.epoch import EpochLog
from skpub.router.locate import Locator, located_table
from skpub.router.sequencer import Sequencer, routed_table
from skpub.router.state import decode_journal, decode_snapshot, encode_journal, encode_snapshot

ROUTER_SNAPSHOT_EVERY = 16
CHUNK_HEADER = b"skpub-chunk-v2"
"""First line of every staged part: ``skpub-chunk-v2 <batch> <part> <index of its first line in the batch>``."""


def part_header(batch_id: int, part: int, first: int) -> bytes:
    """Return the header line of staged part ``part`` of micro-batch ``batch_id``."""
    return b"%s %d %d %d" % (CHUNK_HEADER, batch_id, part, first)


def split_part(content: bytes, path: str) -> tuple[int, int, int, list[bytes]]:
    """Split a staged part into ``(batch, part, first, lines)``.

    Raises
    ------
    CheckpointError
        If the part does not start with skpub's header line.
    """
    header, _, body = content.partition(b"\n")
    fields = header.split(b" ")
    if len(fields) != 4 or fields[0] != CHUNK_HEADER or not all(f.isdigit() for f in fields[1:]):
        raise CheckpointError(f"staged part {path} does not start with skpub's chunk header")
    lines = body[:-1].split(b"\n") if body else []
    return int(fields[1]), int(fields[2]), int(fields[3]), lines


class ParseTask:
    """The ``mapInArrow`` function of the parse stage: one staged part per input row."""

    def __init__(self, checkpoint_root: str, output_root: str, deployment_json: str) -> None:
        self.checkpoint_root = checkpoint_root
        self.output_root = output_root
        self.deployment_json = deployment_json

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Parse and locate each part's lines; yield located rows and a report row per part."""
        tune_gc()
        batch_id = current_batch_id()
        deployment = deployment_from_text(self.deployment_json)
        vocabulary = load_vocabulary(deployment.vocabulary)
        epoch = EpochLog(Checkpoint(self.checkpoint_root).epochs).for_batch(batch_id)
        locator = Locator(deployment, vocabulary, epoch.table)
        for batch in batches:
            paths, contents = batch.column("path").to_pylist(), batch.column("content")
            for k, path in enumerate(paths):
                start = time.thread_time()
                staged_batch, part, first, lines = split_part(contents[k].as_py(), path)
                if staged_batch != batch_id:
                    raise CheckpointError(f"staged part {path} belongs to batch {staged_batch}, not {batch_id}")
                located = locator.locate_lines(lines, batch_id, first)
                table = located_table(located)
                letters = located.dead_letters
                write_part(self.output_root, "dead_letters", batch_id, (d.to_json() for d in letters), f"p{part:03d}")
                report = {
                    "part": part,
                    "first": first,
                    "lines": len(lines),
                    "dead_letters": Counter(d.reason for d in letters),
                    "cpu_seconds": time.thread_time() - start,
                }
                yield _with_report(table, json.dumps(report))


def _with_report(table: pa.Table, report: str) -> pa.RecordBatch:
    """Return the located rows then the report row, as one record batch (one run in stream order)."""
    row = {name: pa.nulls(1, field.type) for name, field in zip(LOCATED_SCHEMA.names, LOCATED_SCHEMA, strict=True)}
    row.update(kind=pa.array([REPORT], pa.int8()), pos=pa.array([-1], pa.int64()), report=pa.array([report]))
    joined = pa.concat_tables([table, pa.table(row, schema=LOCATED_SCHEMA)]).combine_chunks()
    return pa.RecordBatch.from_arrays([column.chunk(0) for column in joined.columns], schema=LOCATED_SCHEMA)


class SequencerTask:
    """The ``mapInArrow`` function of the serial stage, after ``repartition(1)``: one micro-batch."""

    def __init__(
        self, checkpoint_root: str, output_root: str, run_id: str, deployment_json: str, keys: list[int], parts: int
    ) -> None:
        self.checkpoint_root = checkpoint_root
        self.output_root = output_root
        self.run_id = run_id
        self.deployment_json = deployment_json
        self.keys = keys
        self.parts = parts

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Sequence the micro-batch; yield its routed rows (:data:`ROUTED_SCHEMA`)."""
        tune_gc()
        batch_id = current_batch_id()
        table = pa.Table.from_batches(list(batches), schema=LOCATED_SCHEMA)
        start = time.thread_time()
        items, reports = _in_stream_order(table)
        _check_complete(reports, self.parts, batch_id)
        checkpoint = Checkpoint(self.checkpoint_root)
        deployment = deployment_from_text(self.deployment_json)
        restore = time.thread_time()
        sequencer = _sequencer_before(checkpoint, self.run_id, deployment, batch_id)
        restore = time.thread_time() - restore
        decisions = sequencer.sequence_table(items)
        end = stream_position(batch_id, sum(r["lines"] for r in reports))
        routed = routed_table(items, decisions, self.keys, end)
        rejected = _rejected_letters(checkpoint, batch_id, items, decisions)
        write_part(self.output_root, "dead_letters", batch_id, (d.to_json() for d in rejected), "s")
        atomic_write_bytes(checkpoint.router_delta(batch_id), encode_journal(sequencer.registry.take_journal()))
        if batch_id % ROUTER_SNAPSHOT_EVERY == ROUTER_SNAPSHOT_EVERY - 1:
            atomic_write_bytes(checkpoint.router_snapshot(batch_id), encode_snapshot(sequencer.registry))
        dead = Counter(d.reason for d in rejected)
        for r in reports:
            dead.update(r["dead_letters"])
        report = {
            "records": sum(r["lines"] for r in reports),
            "objects": decisions.objects,
            "forwarded": decisions.forwarded,
            "dead_letters": dead,
            "parse_cpu_seconds": sum(r["cpu_seconds"] for r in reports),
            "sequencer_cpu_seconds": time.thread_time() - start,
            "restore_cpu_seconds": restore,
            "epoch": EpochLog(checkpoint.epochs).for_batch(batch_id).number,
            "marks": marks(decisions, items, end),
        }
        atomic_write_text(checkpoint.router_report(batch_id), json.dumps(report))
        _SEQUENCERS[self.run_id] = (batch_id, sequencer)
        yield from routed.to_batches()


_SEQUENCERS: dict[str, tuple[int, Sequencer]] = {}


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


def _in_stream_order(table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """Return the located rows in stream order, and the parse tasks' reports.

    Each parse task's output is one run of rows in stream order ending with
    its report row; the shuffle delivers the runs in any order. The runs are
    put in order of their first position and joined without copying; a
    full sort is the fallback should runs ever overlap.
    """
    kinds = table.column("kind").to_numpy()
    ends = np.flatnonzero(kinds == REPORT)
    if len(kinds) and kinds[-1] != REPORT:
        raise CheckpointError("parsed rows arrived after the last parse report: a parse task's output was cut")
    reports = [json.loads(table.column("report")[int(e)].as_py()) for e in ends]
    starts = np.concatenate([[0], ends[:-1] + 1]) if len(ends) else np.zeros(0, dtype=np.int64)
    positions = table.column("pos").to_numpy()
    runs = sorted((positions[a], int(a), int(b)) for a, b in zip(starts, ends, strict=True) if b > a)
    items = pa.concat_tables([table.slice(a, b - a) for _, a, b in runs]) if runs else table.slice(0, 0)
    order = items.column("pos").to_numpy()
    if len(order) > 1 and not (np.diff(order) > 0).all():
        items = items.take(pc.sort_indices(items.column("pos")))
    return items.combine_chunks(), reports


def _rejected_letters(checkpoint: Checkpoint, batch_id: int, items: pa.Table, decisions) -> list[DeadLetter]:  # noqa: ANN001
    """Dead letters of the sequencer's rejections, with their input lines read back from the staged parts."""
    if not decisions.rejected:
        return []
    lines: dict[int, bytes] = {}
    for path in checkpoint.source.glob(f"chunk-{batch_id:08d}-*.raw"):
        _, _, first, part_lines = split_part(path.read_bytes(), str(path))
        lines.update(enumerate(part_lines, start=first))
    return rejected_letters(decisions, items.column("pos"), lambda pos: lines[position_index(pos)])


def _sequencer_before(checkpoint: Checkpoint, run_id: str, deployment: Deployment, batch_id: int) -> Sequencer:
    """Return the sequencer state after micro-batch ``batch_id - 1``.

    From this worker's cache when it holds that state; caught up from the
    cache by the deltas of the batches it missed when it holds an older one
    (the sequencer task runs in whichever Python worker is free, so a worker
    often misses a batch or two); else rebuilt from the newest registry
    snapshot before ``batch_id`` plus the deltas after it (summaries derived
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
    snapshots = [b for b in checkpoint.router_files("snapshot") if b < batch_id]
    base = max(snapshots, default=-1)
    if base >= 0:
        registry = decode_snapshot(checkpoint.router_snapshot(base).read_bytes())
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
"""Staged bytes per part a micro-batch aims under (Spark's binaryFile reader refuses files over 2 GiB)."""


def stage_parts(lines: list[bytes], batch_id: int, parts: int, directory: Path) -> None:
    """Write one micro-batch's ``lines`` as ``parts`` contiguous staged part files of about equal bytes.

    Some parts may hold no line. Each holds at most its share of the bytes
    plus one line.
    """
    ends = list(accumulate(len(line) + 1 for line in lines))
    total = ends[-1] if ends else 0
    first = 0
    for part in range(parts):
        last = bisect_left(ends, total * (part + 1) / parts) + 1 if part < parts - 1 else len(lines)
        last = min(max(last, first), len(lines))
        chunk = lines[first:last]
        data = part_header(batch_id, part, first) + b"\n" + b"".join(line + b"\n" for line in chunk)
        atomic_write_bytes(directory / f"chunk-{batch_id:08d}-{part:03d}.raw", data)
        first = last


def staged_batches(lines: Iterator[bytes], batch_size: int, parts: int) -> Iterator[list[bytes]]:
    """Group ``lines`` into micro-batches of ``batch_size`` lines, cut early at ``parts x PART_BYTES`` bytes."""
    batch: list[bytes] = []
    size, limit = 0, parts * PART_BYTES
    for line in lines:
        batch.append(line)
        size += len(line) + 1
        if len(batch) >= batch_size or size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
