"""The routing daemon's core (``skpub serve``): durable ingest, the data plane running on, and the logs it serves.

Everything lives in one data directory (DESIGN "The daemon"):

- ``ingest-<first>.log``: every line a client posted, fsync'd before the
  reply, in segments (:class:`~skpub.app.journal.SegmentedLog`); a line's
  *position* is its index; segments no restart can need are removed;
- ``batches-<first>.log``: the micro-batch journal, one ``{"batch", "end",
  "segment", "byte"}`` entry per batch (batch ``b`` is the ingest lines
  from the previous entry's end to its ``end``, which ends at byte ``byte``
  of the ingest segment whose first entry is ``segment``; a batch never
  crosses segments), written durably *before* the batch runs, so batch
  boundaries are fixed once chosen;
- ``deliveries-<first>.log``, ``dead_letters-<first>.log``,
  ``snapshots-<first>.log``: each batch's outputs in commit order, each
  line its SEMANTICS 5 line with one more field first, ``offset`` (1-based,
  the entry's index + 1), in segments (:class:`~skpub.app.journal.SegmentedLog`)
  whose oldest are removed past the retention;
- ``commits-<first>.log``: one :class:`~skpub.app.commits.Commit` per batch
  whose outputs are in those logs, appended after them: each log's entry
  count after the batch, and its accepted subscribe (with the record's
  line), unsubscribe and snapshot records (what ``GET
  /v1/subscriptions/{id}`` and ``GET /v1/snapshots/{id}`` read), compacted
  into ``commits-<batch>.base`` (:mod:`skpub.app.commits`);
- ``deployment.json``: the deployment the directory was created with
  (a restart with another one is refused: results would change);
- ``checkpoints/``: the local engine's newest checkpoints of its pipeline
  (:mod:`skpub.app.engines.local_checkpoint`);
- ``output/``: the balancer's log (its oldest parts removed past
  ``retention_bytes``, as an output log's segments); on Spark also each batch's part files
  until they are committed to the logs, and ``spark/``, the Spark
  engine's checkpoint.

The ingest log, the journal and the commit log keep only what a restart
can need (:meth:`Daemon._release`): memory and disk stay bounded on an
endless stream.

Results are a deterministic function of the lines, the batch boundaries,
the deployment and the initial sample (the first batch's lines; DESIGN
"Exactly once across kill -9"), so a batch that runs again produces the same outputs in the
same order. A restart reads the commit log; the local engine restores its
newest checkpoint and replays the journaled batches after it
(:class:`~skpub.app.engines.local_plane.LocalPlane`), the Spark engine resumes
its query from its checkpoint, and either way a batch's outputs are
appended only when the commit log does not hold the batch yet, and then
only what the logs lack (a commit cut short by ``kill -9``): a consumer's
offsets stay valid, with no gap and no duplicate.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from prometheus_client import Counter, Gauge, GCCollector, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from skpub.app.admission import LIVE, RETIRED, UNKNOWN, Admission
from skpub.app.checkpoint import Checkpoint
from skpub.app.commits import LOGS, Base, Commit, commit_controls, read_base, write_base
from skpub.app.engines import local_checkpoint
from skpub.app.engines.local_plane import CHECKPOINTS, LocalPlane
from skpub.app.journal import LineLog, SegmentedLog, segment_path
from skpub.app.metrics import Metrics
from skpub.app.output import PartRetention
from skpub.app.summary import BatchReport
from skpub.app.targets import Targets, TargetStatus
from skpub.kernel.config import (
    Deployment,
    changes_text,
    deployment_changes,
    deployment_from_json,
    recorded_json,
)
from skpub.kernel.errors import CheckpointError, ConfigError
from skpub.kernel.parts import rename_eight_digit_parts
from skpub.kernel.records import position_index
from skpub.kernel.runtime import CollectorPauses, collector_pauses
from skpub.kernel.storage import atomic_write_bytes
from skpub.kernel.text import load_vocabulary, pin_vocabulary

if TYPE_CHECKING:
    from skpub.app.engines.spark import SparkPlane

LOG = logging.getLogger("skpub.daemon")
"""The daemon's log: one structured line per committed micro-batch (``batch``) and per refused request
(``refused``); ``skpub serve`` writes it as JSON lines on standard error (:class:`skpub.app.serve.JsonLines`)."""

COMPACT_RATIO = 4
"""The commit log is compacted again once it holds 1 / COMPACT_RATIO as many commits after its base as the base
holds definitions and snapshots (or ``Limits.compact_commits``, if more)."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Limits:
    """What a client may ask of the daemon (every resource an input controls is bounded).

    ``max_body_bytes``: a ``POST /v1/records`` body; ``max_backlog``: ingest
    lines acknowledged but not yet in a batch (beyond it, 429); ``max_id``:
    characters of an id in a path; ``max_limit``, ``max_wait``: a read's
    entries and long-poll seconds; ``trigger``: seconds the data plane waits
    for lines before it cuts a batch of fewer than ``batch_size``;
    ``checkpoint_seconds``: the local engine's pipeline is checkpointed
    after a batch once this many seconds passed since the last checkpoint
    (a restart replays only the batches after it); ``retry_seconds``: the
    wait before a commit the disk refused is tried again; ``segment_bytes``,
    ``retention_bytes``: every log's segment size and each output log's
    retention (the balancer's log's too); ``compact_commits``: the commit log is compacted into a base
    once it holds this many commits after the last, or a
    :data:`COMPACT_RATIO`-th of the base's definitions and snapshots if that is
    more (a base costs O(1) lines per batch).
    """

    max_body_bytes: int = 16 << 20
    max_backlog: int = 500_000
    max_id: int = 256
    max_limit: int = 10_000
    max_wait: float = 30.0
    trigger: float = 0.1
    checkpoint_seconds: float = 60.0
    retry_seconds: float = 1.0
    segment_bytes: int = 64 << 20
    retention_bytes: int = 1 << 30
    compact_commits: int = 10_000


class _PauseCollector(Collector):
    """Exports :class:`~skpub.kernel.runtime.CollectorPauses` as ``skpub_gc_pause_seconds_total{generation}``."""

    def __init__(self, pauses: CollectorPauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[CounterMetricFamily]:
        """Yield the counter family, one sample per generation."""
        family = CounterMetricFamily(
            "skpub_gc_pause_seconds",
            "Wall seconds the garbage collector took, from each collection's start to its stop (finalizers included)",
            labels=["generation"],
        )
        for generation, seconds in enumerate(self.pauses.seconds):
            family.add_metric([str(generation)], seconds)
        yield family


class DaemonMetrics:
    """What the daemon exports beyond a run's :class:`~skpub.app.metrics.Metrics`, in the same registry.

    Ingest (records acknowledged, backlog), batch wall time against the
    trigger, ingest-to-delivery latency (from a request's acknowledgement to
    the commit of the batch that holds its last line), HTTP requests and
    their durations per route, the process's memory and CPU, and its
    garbage collections per generation (``python_gc_collections_total``;
    generation 2 counts the full ones, the timed ones of
    :class:`~skpub.kernel.runtime.FullCollections` among them) and the
    seconds they paused it (``skpub_gc_pause_seconds_total``, from
    :func:`~skpub.kernel.runtime.collector_pauses`).
    """

    def __init__(self, metrics: Metrics, daemon: Daemon) -> None:
        r = metrics.registry
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        r.register(_PauseCollector(collector_pauses()))
        self.ingested = Counter("skpub_ingest_records", "Records acknowledged (durable in the ingest log)", registry=r)
        backlog = Gauge("skpub_ingest_backlog", "Records acknowledged and not yet processed", registry=r)
        backlog.set_function(lambda: daemon.backlog)
        live = Gauge("skpub_live_subscriptions", "Live subscriptions as of the last commit", registry=r)
        live.set_function(lambda: len(daemon.live_ids))
        used = Gauge("skpub_log_bytes", "Bytes on disk of each of the daemon's logs", ["log"], registry=r)
        for name, log in daemon.all_logs().items():
            used.labels(log=name).set_function(lambda log=log: log.nbytes)
        trigger = Gauge("skpub_batch_trigger_seconds", "Seconds the data plane waits before a short batch", registry=r)
        trigger.set(daemon.limits.trigger)
        self.batch_seconds = Histogram(
            "skpub_batch_duration_seconds", "Wall seconds per micro-batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "skpub_ingest_to_delivery_seconds",
            "Seconds from a request's acknowledgement to the commit of its last record's batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivered = Counter(
            "skpub_delivery_lines",
            "Lines appended to the delivery log, by event (match, enter, exit)",
            ["event"],
            registry=r,
        )
        self.requests = Counter("skpub_http_requests", "HTTP requests", ["route", "method", "status"], registry=r)
        self.stalls = Counter(
            "skpub_commit_retries", "Batch commits the disk refused (full or failing), tried again", registry=r
        )
        self.request_seconds = Histogram(
            "skpub_http_request_duration_seconds",
            "HTTP request seconds",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )


class Daemon:
    """The data directory, its logs and the data plane thread.

    Parameters
    ----------
    data : Path
        The data directory (created if missing).
    deployment : Deployment
        Must equal the one the directory was created with.
    engine : str
        ``"local"`` (the data plane in this process,
        :class:`~skpub.app.engines.local_plane.LocalPlane`)
        or ``"spark"`` (a streaming query over the ingest log,
        :class:`~skpub.app.engines.spark.SparkPlane`).
    master : str
        Spark's master URL (``engine="spark"`` only).

    Raises
    ------
    ConfigError
        If ``data`` was created with another deployment.
    OutputError
        If a log file in ``data`` is not skpub's.
    """

    def __init__(
        self,
        data: str | Path,
        deployment: Deployment,
        limits: Limits | None = None,
        engine: str = "local",
        master: str = "local[2]",
    ) -> None:
        self.data = Path(data)
        self.data.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.data)
        try:
            self._open(deployment, limits, engine, master)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self, deployment: Deployment, limits: Limits | None, engine: str, master: str) -> None:
        if deployment.vocabulary:  # Spark's tasks run in other working directories
            deployment = deployment.replace(vocabulary=str(Path(deployment.vocabulary).absolute()))
        deployment = pin_vocabulary(deployment)  # recorded in DIR; a resume, and every task, checks the file
        self.deployment = _claim(self.data / "deployment.json", deployment)
        self.limits = limits or Limits()
        self.engine, self.master = engine, master
        self.vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
        self.ingest = _segmented(self.data, "ingest", self.limits.segment_bytes)
        self.batches = _segmented(self.data, "batches", self.limits.segment_bytes)
        self.commits = _segmented(self.data, "commits", self.limits.segment_bytes)
        self.logs = {
            name: _segmented(self.data, name, self.limits.segment_bytes, self.limits.retention_bytes) for name in LOGS
        }
        self.metrics = Metrics()
        self.served = DaemonMetrics(self.metrics, self)
        rename_eight_digit_parts(self.data / "output")  # parts an older skpub named: name order is batch order
        self._balancer_log = PartRetention(self.data / "output", "balancer", self.limits.retention_bytes)
        self._acks: deque[tuple[int, float]] = deque()  # (end position, acknowledged at) of requests in the backlog
        self._post_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.stalled: str | None = None  # why the last commit is being retried
        self._state = Base(Commit(-1, 0, dict.fromkeys(LOGS, 0)))  # what the commits so far add up to
        self._based = -1  # the batch of the newest commit log base
        self._pinned = False  # definitions of an earlier skpub's commits point into the ingest log: keep it whole
        self.ends = BatchEnds()
        self._recover()
        self.targets = Targets(
            self.data / "targets",
            read=lambda after, limit: self.read_committed("deliveries", after, limit),
            committed=lambda: self.committed("deliveries"),
            earliest=lambda: self.earliest("deliveries"),
            gone=Gone,
            on_change=_target_changed,
        )
        self.metrics.registry.register(_TargetCollector(self.targets))
        space, max_bytes = self.deployment.space, self.deployment.max_record_bytes
        self.admission = Admission(space, max_bytes, self._standing, lambda: self.processed)
        self.admission.appended(self.ingest.read(self.processed, self.backlog), self.processed)
        self.run_batch = -1  # the last micro-batch the data plane ran in this process (a replayed one included)
        self._started = False  # the data plane runs (local: its checkpoint restored; Spark: its query started)
        self.starting: str | None = "opening"  # what the data plane is starting (None once it runs), for /readyz
        self._idle = False  # a Spark data plane waiting for its first record: nothing to start it on yet
        self._plane: LocalPlane | SparkPlane | None = None  # the data plane, once it starts
        self.batch_started = time.monotonic()  # when the batch in flight (or the last one) started
        self._thread = threading.Thread(target=self._run, name="skpub-data-plane", daemon=True)

    @property
    def _committed(self) -> Commit:
        return self._state.commit

    @property
    def snapshots(self) -> dict[str, tuple[int, int]]:
        """Taken snapshot id -> (first entry, entries) of its lines in the snapshot log."""
        return self._state.snapshots

    def _recover(self) -> None:
        """Read the batch journal, the newest commit log base and the commits after it.

        Raises
        ------
        CheckpointError
            If the logs do not follow each other (entries removed that a base does not cover, or damaged).
        """
        self.ends = BatchEnds(self.batches.first)
        for i, raw in enumerate(self.batches.read(self.batches.first, self.batches.count), start=self.batches.first):
            entry = orjson.loads(raw)
            if int(entry["batch"]) != i:
                raise CheckpointError(f"the batch journal's entry {i} names batch {entry['batch']}")
            self.ends.append(int(entry["end"]))
        base = read_base(self.data)
        if base is not None:
            self._state, self._based = base, base.commit.batch
        after = self._committed.batch + 1
        if self.commits.first > after:
            raise CheckpointError(f"the commit log starts at batch {self.commits.first}; no base holds those before")
        for raw in self.commits.read(after, self.commits.count - after):
            commit = Commit.from_json(raw)
            if commit.batch != self._committed.batch + 1:
                raise CheckpointError(f"the commit log holds batch {commit.batch} after {self._committed.batch}")
            self._pinned |= self._state.account(commit, self._ingest_line)
        for name, log in self.logs.items():  # what a commit cut short appended: never served, done again
            if log.count > self._committed.totals[name]:
                log.truncate(self._committed.totals[name])
            elif log.count < self._committed.totals[name]:
                raise CheckpointError(f"{log.name} holds fewer entries than the commit log says were committed")

    def _ingest_line(self, index: int) -> bytes:
        """Return ingest line ``index`` (an earlier skpub's commits point there for definitions).

        Raises
        ------
        CheckpointError
            If the ingest log no longer keeps it.
        """
        line = self.ingest.read(index, 1)
        if not line:
            raise CheckpointError(f"a subscription's definition at ingest position {index} is no longer kept")
        return line[0]

    # --- the client's side -------------------------------------------------------------------------------
    @property
    def processed(self) -> int:
        """Ingest lines in batches whose outputs are committed."""
        return self._committed.end

    @property
    def backlog(self) -> int:
        """Ingest lines acknowledged and not yet processed."""
        return self.ingest.count - self.processed

    def post(self, lines: list[bytes]) -> tuple[int, int]:
        """Append ``lines`` to the ingest log durably; return the first position and the one after the last."""
        with self._post_lock:  # acknowledgements queue in position order
            return self._acknowledge(lines)

    def post_subscribe(self, sid: str, line: bytes) -> tuple[int, int] | None:
        """Append subscribe record ``line`` of id ``sid`` if the data plane will accept it (SEMANTICS section 7).

        Returns the positions as :meth:`post` does, or None when ``sid`` is
        live (or will be) with this very definition: nothing is appended.

        Raises
        ------
        Refusal
            For an invalid definition, or an id live with another one or used before.
        """
        with self._post_lock:  # the check and the append it allows are one step
            if self.admission.check_subscribe(sid, line) is None:
                return None
            return self._acknowledge([line])

    def post_unsubscribe(self, sid: str) -> tuple[int, int]:
        """Append an unsubscribe of ``sid`` if it is live (or will be); positions as :meth:`post` returns them.

        Raises
        ------
        Refusal
            404 ``unknown_id`` when ``sid`` is not live.
        """
        with self._post_lock:
            self.admission.check_unsubscribe(sid)
            return self._acknowledge([orjson.dumps({"type": "unsubscribe", "id": sid})])

    def _acknowledge(self, lines: list[bytes]) -> tuple[int, int]:
        """Append ``lines`` durably and project them for :attr:`admission` (under the ingest lock).

        Raises
        ------
        BacklogFull
            If the backlog has no room for them (``Limits.max_backlog``): nothing is appended.
        """
        if self.backlog + len(lines) > self.limits.max_backlog:
            raise BacklogFull(self.backlog)
        first, end = self.ingest.append(lines)
        self._acks.append((end, time.monotonic()))
        self.admission.appended(lines, first)
        self.served.ingested.inc(end - first)
        return first, end

    def _standing(self, sid: str) -> tuple[str, bytes | None]:
        """Return what ``sid`` is as of the last commit, for :attr:`admission`."""
        line = self._state.definitions.get(sid)
        if line is not None:
            return LIVE, line
        return (RETIRED, None) if sid in self._state.retired else (UNKNOWN, None)

    @property
    def phase(self) -> str:
        """What the data plane is doing, as ``/readyz`` reports it with the counts.

        ``starting`` (restoring a checkpoint, or starting Spark and its
        query: :attr:`starting` says which), ``running`` (replaying the batches
        journaled before a restart, then following the ingest log:
        :attr:`run_batch` moves; a new Spark data plane waits there for its
        first record, and starts Spark on it) or ``failed``. A client waits
        while the phase, what starts or the counts move, not on a fixed clock.
        """
        if self.failure is not None:
            return "failed"
        return "running" if self._started or self._idle else "starting"

    @property
    def ready(self) -> bool:
        """Whether the data plane runs and has processed everything acknowledged (and is not stalled or failed)."""
        runs = self._started or self._idle
        return runs and self.failure is None and self.stalled is None and self.processed == self.ingest.count

    @property
    def committed_batch(self) -> int:
        """The last micro-batch whose outputs are committed (-1 before the first)."""
        return self._committed.batch

    def committed(self, name: str) -> int:
        """Entries of output log ``name`` that are committed: all a client may read."""
        return self._committed.totals[name]

    def earliest(self, name: str) -> int:
        """Return the earliest index of output log ``name`` still kept (retention removed those before)."""
        return self.logs[name].first

    def read_committed(self, name: str, after: int, limit: int) -> list[bytes]:
        """Return up to ``limit`` committed entries of output log ``name`` from index ``after`` on.

        Raises
        ------
        Gone
            If entries from ``after`` on are no longer kept.
        """
        if after < self.earliest(name):
            raise Gone(name, self.earliest(name))
        entries = self.logs[name].read(after, min(limit, self.committed(name) - after))
        if after < self.earliest(name):  # retention ran while reading
            raise Gone(name, self.earliest(name))
        return entries

    @property
    def live_ids(self) -> Sized:
        """The ids of the live subscriptions as of the last commit."""
        return self._state.definitions

    def all_logs(self) -> dict[str, SegmentedLog]:
        """Every log of the data directory by name: the ingest log, the batch journal, the commit log, the outputs."""
        return {"ingest": self.ingest, "batches": self.batches, "commits": self.commits, **self.logs}

    def definition(self, sid: str) -> bytes | None:
        """Return live subscription ``sid``'s accepted subscribe record, or None."""
        return self._state.definitions.get(sid)

    def definitions_after(
        self, after: str | None, limit: int, kind: str | None, scan: int
    ) -> tuple[list[bytes], str | None]:
        """Return up to ``limit`` live definitions after id ``after`` in id order, and the id to continue after.

        Only those of ``kind`` if given; at most ``scan`` definitions are
        looked at per call, so a rare kind costs a bounded call, and the
        continuation id (None once the end is reached) then points past what
        was looked at. As of the last batch the data plane committed.
        O(log live + scan).
        """
        with self._state_lock:
            held = self._state.definitions
            ids = held.irange(minimum=after, inclusive=(False, True)) if after is not None else iter(held.keys())
            looked = [(sid, held[sid]) for sid in itertools.islice(ids, scan)]
        out: list[bytes] = []
        last = None
        for sid, line in looked:
            last = sid
            if kind is None or orjson.loads(line).get("kind") == kind:
                out.append(line)
                if len(out) == limit:
                    break
        more = len(out) == limit or len(looked) == scan
        return out, (last if more else None)

    def result(self, sid: str) -> list | None:
        """Return ranked subscription ``sid``'s current result, ``[[object id, score or dist], ...]``, or None."""
        merge = self._plane.merge if self._plane is not None else None
        merged = merge.subscriptions.get(sid) if merge is not None else None
        return None if merged is None else [[oid, value] for oid, value, _ in merged.result]

    # --- the data plane ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the data plane thread (journaled batches first, then the ingest log) and the targets' threads."""
        self._thread.start()
        self.targets.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the batch in flight and stop the data plane."""
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.targets.stop()
        for log in (self.ingest, self.batches, self.commits, *self.logs.values()):
            log.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _run(self) -> None:
        try:
            if self.engine == "spark":
                self._run_spark()
            else:
                self._run_local()
        except BaseException as exc:  # noqa: BLE001 - the thread must report, /readyz turns false
            self.failure = exc
            LOG.error("failed", exc_info=exc, extra={"fields": {"committed_batch": self.committed_batch}})
            raise

    def _cut(self) -> int | None:
        """Journal the next batch once lines wait (after ``trigger`` for a short one); return its id or None.

        A batch ends at the end of the ingest segment it starts in (the
        Spark source reads it from that one file), so a batch at a segment's
        end may be short; its boundaries are journaled like any other's.
        """
        start = self.ends.start(self.ends.count)
        if not self.ingest.wait(start, self.limits.trigger):
            return None
        if self.ingest.count - start < self.deployment.batch_size:
            time.sleep(self.limits.trigger)
        end = min(self.ingest.count, start + self.deployment.batch_size, self.ingest.segment_end(start))
        segment, byte = self.ingest.end_position(end)
        with self.ends.lock:  # Spark may run the batch once journaled: it must find its end
            batch_id = self.ends.count
            entry = orjson.dumps({"batch": batch_id, "end": end, "segment": segment, "byte": byte})
            refused = False
            while True:
                try:
                    self.batches.append([entry])
                    break
                except OSError as exc:  # a full or failing disk: nothing runs until the journal takes it
                    refused, self.stalled = True, f"the batch journal refuses writes: {exc.strerror or exc}"
                    self.served.stalls.inc()
                    if self.stopping.wait(self.limits.retry_seconds):
                        raise
            if refused:
                self.stalled = None
            self.ends.append(end)
        return batch_id

    def _run_local(self) -> None:
        """Restore the newest checkpoint and replay the journaled batches after it, then cut and run batches.

        Outputs the commit log already holds are not appended again.
        """
        self.starting = "restoring the newest checkpoint"
        plane = self._plane = LocalPlane(self)
        replay = plane.restore()
        self._started, self.starting = True, None
        if not self.ends.known(replay) or self.ends.start(replay) < self.ingest.first:
            raise CheckpointError(
                f"{self.data} holds no readable local checkpoint after batch {replay - 1}, and the ingest log "
                f"before {self.ingest.first} is no longer kept (was it run with --engine spark?)"
            )
        for batch_id in range(replay, self.ends.count):
            plane.step(batch_id)
        while not self.stopping.is_set():
            batch_id = self._cut()
            if batch_id is not None:
                plane.step(batch_id)
            else:
                plane.idle()

    def _run_spark(self) -> None:
        """Start the streaming query over the journal, then cut batches, one in flight at a time, until stopped.

        The first batch's lines sample the initial partitioning. On a stop,
        the batch in flight commits before the query stops (up to a minute).
        """
        from skpub.app.engines.spark import SparkPlane

        self.starting, self._idle = None, True  # ready while nothing is acknowledged: Spark starts on the first record
        while not self.ends.count and not self.stopping.is_set():
            self._cut()
        self.starting, self._idle = "starting Spark", False
        if not self.ends.count:
            return
        self._check_spark_resume()
        self._plane = SparkPlane(self, self._first_sample)  # it names what it starts in self.starting
        self._started, self.starting = True, None
        try:
            while not self.stopping.is_set():
                self._plane.check()
                if self.processed < self.ends.start(self.ends.count):
                    self._plane.wait(self.limits.trigger)
                    continue
                self._cut()
            deadline = time.monotonic() + 60.0
            while self.processed < self.ends.start(self.ends.count) and time.monotonic() < deadline:
                self._plane.check()
                self._plane.wait(self.limits.trigger)
        finally:
            self._plane.stop()

    def _first_sample(self) -> list[bytes]:
        """Return the first batch's lines that sample the initial partitioning (a new Spark checkpoint only).

        Raises
        ------
        CheckpointError
            If the ingest log no longer keeps them (the directory was run on the local engine before).
        """
        if self.ingest.first > 0 or not self.ends.known(0):
            raise CheckpointError(
                f"{self.data / 'spark'} holds no Spark checkpoint, and the first batch is no longer kept (the ingest "
                f"log keeps lines from {self.ingest.first}, the journal batches from {self.ends.first}; was it run "
                "with --engine local?)"
            )
        return self.ingest.read(0, min(self.ends.end(0), self.deployment.sample_size))

    def _check_spark_resume(self) -> None:
        """Refuse a Spark checkpoint that would resume at a batch the journal or the ingest log no longer keeps.

        Raises
        ------
        CheckpointError
            If so (the data directory ran on the local engine since).
        """
        ckpt = Checkpoint(self.data / "spark")
        if ckpt.read_manifest() is None:  # a new checkpoint starts at the first batch: _first_sample checks
            return
        resume = ckpt.newest("commits") + 1
        kept = self.ends.known(resume) and resume >= self.batches.first
        if not kept or (resume < self.ends.count and self.ends.start(resume) < self.ingest.first):
            raise CheckpointError(
                f"the Spark checkpoint {ckpt.root} resumes at batch {resume}, which the batch journal (from batch "
                f"{self.batches.first}) or the ingest log (from line {self.ingest.first}) no longer keeps "
                "(was the data directory run with --engine local since?)"
            )

    def _replay_from(self) -> int:
        """Return the earliest batch a restart may run again (the ingest log keeps its lines on).

        Local engine: the one after the oldest checkpoint kept (a restart
        falls back to it when the newest is unreadable; the first batch with
        none). Spark: its checkpoint may be one batch behind the commit log;
        one more batch is kept for safety.
        """
        if self.engine == "spark":
            return max(0, self._committed.batch - 1)
        saved = [b for b in local_checkpoint.checkpoints(self.data / CHECKPOINTS) if b <= self._committed.batch]
        return min(saved) + 1 if saved else 0

    # --- committing a batch's outputs --------------------------------------------------------------------
    def commit(self, report: BatchReport, produced: dict[str, list[bytes]]) -> None:
        """Append micro-batch ``report.batch_id``'s outputs to the logs, then its entry to the commit log.

        ``produced`` holds each output log's entries (SEMANTICS 5 lines,
        without ``offset``) in commit order; each dead letter also holds its
        stream position ``pos``, which its entry replaces by ``position``,
        its ingest position (the one its request was answered with), in
        position order. Exactly once across restarts
        and replays: a batch the commit log holds is not appended again;
        clients read committed entries only (:meth:`read_committed`), and a
        restart cuts the logs back to the last commit, so a batch whose
        commit was cut short is appended whole again (in whatever order its
        run gives: nobody read the first attempt).

        Raises
        ------
        CheckpointError
            If the batch is not the one after the last committed, or its
            records are not its journaled boundaries.
        """
        batch_id, last = report.batch_id, self._committed
        self.run_batch = max(self.run_batch, batch_id)
        if batch_id <= last.batch:
            return
        start, end = self.ends.start(batch_id), self.ends.end(batch_id)
        if batch_id != last.batch + 1 or report.records != end - start:
            raise CheckpointError(
                f"micro-batch {batch_id} ({report.records} records) is not the journaled batch after {last.batch} "
                f"({end - start} records)"
            )
        produced = {**produced, "dead_letters": _positioned(produced["dead_letters"], start)}
        totals = {name: last.totals[name] + len(entries) for name, entries in produced.items()}
        snapshot_lines = [orjson.loads(line) for line in produced["snapshots"]]
        controls = commit_controls(report.controls, start, last.totals["snapshots"], snapshot_lines)
        commit = Commit(batch_id, end, totals, controls, self._definitions_of(report.controls, start, end))
        self.targets.committed_at(totals["deliveries"])  # before the lines can be read: their age is never short
        while True:
            try:
                self._append(last, produced, commit)
                break
            except OSError as exc:  # a full or failing disk: nothing of the batch is served; try again
                self.stalled = f"the output logs refuse writes: {exc.strerror or exc}"
                self.served.stalls.inc()
                if self.stopping.wait(self.limits.retry_seconds):
                    raise
        self.stalled = None
        with self._state_lock:  # a listing reads the definitions from a request thread
            self._state.account(commit, self._ingest_line)
        self._release()
        self._observe(report, produced)

    def _release(self) -> None:
        """Compact the commit log when due; drop what no restart can need from the ingest log and the journal.

        Also applies the output logs' retention, and the same to the
        balancer's log (``output/balancer/``, one part per batch that
        rebalanced: on an endless stream it would grow without bound).

        A restart runs again from :meth:`_replay_from` at the earliest: it
        needs the journal from the batch before (its start) and the ingest
        lines from its start. A failed write or removal is reported and
        tried again after the next batch (nothing is removed without a base).
        """
        since = self._committed.batch - self._based
        held = len(self._state.definitions) + len(self.snapshots)
        if self._pinned or since >= max(self.limits.compact_commits, held // COMPACT_RATIO):
            try:
                write_base(self.data, self._state)
                self._based, self._pinned = self._committed.batch, False
                self.commits.release(self._based + 1)
            except OSError as exc:  # the batch is committed; compacted after a later one
                LOG.warning("base_not_written", extra={"fields": {"error": str(exc)}})
        try:
            for log in self.logs.values():
                log.retain()
            replay = self._replay_from()
            self.ends.forget(replay - 1)
            self.batches.release(replay - 1)
            if not self._pinned:
                self.ingest.release(self.ends.start(replay))
        except OSError as exc:  # what is not removed now is removed after a later batch
            LOG.warning("release_failed", extra={"fields": {"what": "log segments", "error": str(exc)}})
        try:
            self._balancer_log.add(self._committed.batch - 1)  # a batch's line is written after its commit (local)
            self._balancer_log.retain()
        except OSError as exc:  # what is not removed now is removed after a later batch
            LOG.warning("release_failed", extra={"fields": {"what": "balancer log parts", "error": str(exc)}})

    def _definitions_of(self, accepted: list[tuple[int, str, str]], start: int, end: int) -> dict[str, str]:
        """Return the lines of a batch's accepted subscribe records by id (read back from the ingest log)."""
        subscribes = [(pos, sid) for pos, kind, sid in accepted if kind == "subscribe"]
        lines = self.ingest.read(start, end - start) if subscribes else []
        return {sid: lines[position_index(pos)].decode("utf-8", "replace") for pos, sid in subscribes}

    def _append(self, last: Commit, produced: dict[str, list[bytes]], commit: Commit) -> None:
        """Append a batch's entries to each output log after ``last``'s totals, then ``commit`` to the commit log."""
        for name, entries in produced.items():
            log, first = self.logs[name], last.totals[name]
            if log.count != first:  # an append refused midway left part of it
                log.truncate(first)
            if entries:
                log.append([_with_offset(line, first + i + 1) for i, line in enumerate(entries)])
        self.commits.append([commit.to_json()])

    def _observe(self, report: BatchReport, produced: dict[str, list[bytes]]) -> None:
        """Count a committed batch (its wall time, its requests' ingest-to-delivery latency, its delivery lines).

        Also logs one structured line (:data:`LOG`, event ``batch``).
        """
        deliveries = produced["deliveries"]
        now = time.monotonic()
        seconds = now - self.batch_started
        self.served.batch_seconds.observe(seconds)
        self.batch_started = now
        LOG.info(
            "batch",
            extra={
                "fields": {
                    "batch": report.batch_id,
                    "records": report.records,
                    "objects": report.objects,
                    "deliveries": len(deliveries),
                    "dead_letters": len(produced["dead_letters"]),
                    "seconds": round(seconds, 6),
                    "processed": self.processed,
                    "backlog": self.backlog,
                }
            },
        )
        while self._acks and self._acks[0][0] <= self.processed:
            self.served.latency.observe(now - self._acks.popleft()[1])
        for event in ("match", "enter", "exit"):  # a quote inside an id is escaped: this is the field
            field_bytes = b'"event":"%s"' % event.encode()
            self.served.delivered.labels(event=event).inc(sum(field_bytes in line for line in deliveries))


class _TargetCollector(Collector):
    """Each target's counts and state at scrape time (``skpub_target_*{target}``)."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        by = ["target"]
        families = {
            "delivered": CounterMetricFamily("skpub_target_delivered", "Delivery lines a target took", labels=by),
            "failed": CounterMetricFamily("skpub_target_failures", "Sends a target did not take", labels=by),
            "behind_retention": CounterMetricFamily(
                "skpub_target_behind_retention", "Delivery lines retention removed before a target took them", labels=by
            ),
            "lag": GaugeMetricFamily("skpub_target_lag", "Committed delivery lines after a target's cursor", labels=by),
            "lag_seconds": GaugeMetricFamily(
                "skpub_target_lag_seconds", "Age of the first delivery line after a target's cursor", labels=by
            ),
            "paused": GaugeMetricFamily("skpub_target_paused", "1 while a target is paused (failing)", labels=by),
        }
        for name in list(self.targets.targets):
            status = self.targets.status(name)
            if status is None:
                continue
            for key in ("delivered", "failed", "behind_retention", "lag", "lag_seconds"):
                families[key].add_metric([name], status[key])
            families["paused"].add_metric([name], 1.0 if status["state"] == "paused" else 0.0)
        yield from families.values()


class BacklogFull(Exception):  # noqa: N818 - an answer (429), not an error of the daemon
    """The ingest backlog cannot take a request's lines now; the client retries later."""

    def __init__(self, backlog: int) -> None:
        super().__init__(f"the ingest backlog is full ({backlog} lines not yet processed); retry later")


def _positioned(letters: list[bytes], start: int) -> list[bytes]:
    """Return a batch's dead letters (JSON with ``pos``) with their ingest position instead, in position order.

    ``start`` is the batch's first ingest position; a letter's position is
    ``start`` plus its index in the batch (:func:`position_index`). One
    without ``pos`` (a Spark part file an skpub before 2026-11-29 wrote for
    a batch replayed after the upgrade) gets a null position, last.
    """
    docs = [orjson.loads(line) for line in letters]
    stream = [doc.pop("pos", None) for doc in docs]
    positions = [start + position_index(pos) if isinstance(pos, int) else None for pos in stream]
    order = sorted(range(len(docs)), key=lambda i: (positions[i] is None, positions[i] or 0))
    return [orjson.dumps({"position": positions[i], **docs[i]}) for i in order]


def _target_changed(name: str, status: TargetStatus, event: str | None) -> None:
    """Log a target's events (``paused``, ``resumed``, ``behind_retention``) as structured lines."""
    if event is not None:
        fields = {"target": name, "change": event, "cursor": status.cursor, "last_error": status.last_error}
        (LOG.warning if event != "resumed" else LOG.info)("target", extra={"fields": fields})


class BatchEnds:
    """The ingest end of each journaled batch, from batch :attr:`first` on (those before are forgotten).

    Thread-safe: on Spark a batch commits (and batches are forgotten) on
    Spark's thread while the data plane thread journals the next; a caller
    that journals holds :attr:`lock` from the journal's append to
    :meth:`append`, so no reader sees a journaled batch it does not know.
    """

    def __init__(self, first: int = 0) -> None:
        self.lock = threading.RLock()
        self.first = first
        self._ends: list[int] = []

    @property
    def count(self) -> int:
        """Batches journaled (the next batch's id)."""
        with self.lock:
            return self.first + len(self._ends)

    def append(self, end: int) -> None:
        """Journal the next batch, which ends before ingest index ``end``."""
        with self.lock:
            self._ends.append(end)

    def end(self, batch_id: int) -> int:
        """Return the ingest index after batch ``batch_id``'s last line.

        Raises
        ------
        IndexError
            If the batch is forgotten or not journaled.
        """
        with self.lock:
            if not self.first <= batch_id < self.first + len(self._ends):
                raise IndexError(f"batch {batch_id} is not among the journaled batches from {self.first} on")
            return self._ends[batch_id - self.first]

    def known(self, batch_id: int) -> bool:
        """Return whether batch ``batch_id`` can run again: it is journaled and its start is not forgotten."""
        with self.lock:
            return self.first <= max(batch_id - 1, 0) and batch_id <= self.count

    def start(self, batch_id: int) -> int:
        """Return the ingest index of batch ``batch_id``'s first line (``batch_id`` may be :attr:`count`)."""
        return self.end(batch_id - 1) if batch_id > 0 else 0

    def forget(self, before: int) -> None:
        """Forget the batches before ``before`` (the newest is always kept)."""
        with self.lock:
            drop = min(before, self.count - 1) - self.first
            if drop > 0:
                del self._ends[:drop]
                self.first += drop


class Gone(Exception):
    """Entries a client asked for were removed by retention; ``earliest`` is the first index kept."""

    def __init__(self, name: str, earliest: int) -> None:
        super().__init__(f"{name} before offset {earliest + 1} are no longer kept")
        self.earliest = earliest


def _segmented(data: Path, name: str, segment_bytes: int, retention_bytes: int | None = None) -> SegmentedLog:
    """Open log ``name`` of ``data`` in segments.

    A single ``<name>.log`` of an earlier skpub becomes the first segment.
    """
    single = data / f"{name}.log"
    if single.exists() and not any(data.glob(f"{name}-*.log")):
        LineLog(single).close()  # checks that it is skpub's
        single.rename(segment_path(data, name, 0))
    return SegmentedLog(data, name, segment_bytes, retention_bytes)


def _with_offset(line: bytes, offset: int) -> bytes:
    """Return JSON object ``line`` with ``"offset"`` as its first field."""
    return b'{"offset":%d,%s' % (offset, line[1:]) if line != b"{}" else b'{"offset":%d}' % offset


def _lock(data: Path) -> int:
    """Hold ``data/serve.lock`` exclusively for this process's life (an advisory ``flock``); return its descriptor.

    Raises
    ------
    ConfigError
        If another daemon holds it: two data planes on one directory would
        interleave their logs and remove each other's files.
    """
    fd = os.open(data / "serve.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{data} is in use by another skpub serve") from None
    return fd


def recorded_deployment(data: str | Path) -> Deployment | None:
    """Return the deployment data directory ``data`` was created with, or None for a new directory.

    ``skpub serve`` without ``--config`` resumes with it (its flags on top),
    so a restart after an upgrade that changed a default still opens the
    directory.

    Raises
    ------
    ConfigError
        If the recorded deployment is damaged.
    """
    path = Path(data) / "deployment.json"
    return _read_recorded(path) if path.is_file() else None


def _read_recorded(path: Path) -> Deployment:
    """Read a data directory's recorded deployment as the skpub that wrote it ran it.

    A key of ``KEYS_ADDED`` the record lacks takes the value under which
    skpub behaved as before the key
    (:func:`~skpub.kernel.config.recorded_json`); any other missing key its
    default.

    Raises
    ------
    ConfigError
        Naming ``path``, if it is not a deployment skpub can read.
    """
    try:
        return deployment_from_json(recorded_json(orjson.loads(path.read_bytes())))
    except (OSError, orjson.JSONDecodeError, ConfigError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{path} is not a deployment skpub can read: {exc}") from None


def _claim(path: Path, deployment: Deployment) -> Deployment:
    """Record the data directory's deployment, or check it is the one recorded."""
    if path.exists():
        recorded = _read_recorded(path)
        changes = deployment_changes(*(orjson.loads(orjson.dumps(d.to_json())) for d in (recorded, deployment)))
        if changes:
            advice = (  # an edited vocabulary file is not a value to give: only the file it recorded resumes
                ""
                if all(c.startswith("vocabulary_digest:") for c in changes)
                else "; give the recorded values, or start skpub serve without --config to resume with them"
            )
            raise ConfigError(
                f"{path.parent} was created with another deployment ({path}): {changes_text(changes)}{advice}"
            )
        # A record older than vocabulary digests is read as it was; this process's tasks still check the file.
        return recorded.replace(vocabulary_digest=deployment.vocabulary_digest)
    atomic_write_bytes(path, orjson.dumps(deployment.to_json(), option=orjson.OPT_INDENT_2))
    return deployment
