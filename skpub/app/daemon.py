"""The routing daemon's core (``skpub serve``): durable ingest, the data plane running on, and the logs it serves.

Everything lives in one data directory (DESIGN "The daemon"):

- ``ingest.log``: every line a client posted, fsync'd before the reply
  (:class:`~skpub.app.journal.LineLog`); a line's *position* is its index;
- ``batches.log``: the micro-batch journal, one ``{"batch", "end"}`` entry
  per batch (batch ``b`` is the ingest lines from the previous entry's end to
  its ``end``), written durably *before* the batch runs, so batch boundaries
  are fixed once chosen;
- ``deliveries.log``, ``dead_letters.log``, ``snapshots.log``: each batch's
  outputs in commit order, each line its SEMANTICS 5 line with one more
  field first, ``offset`` (1-based, the entry's index + 1);
- ``deployment.json``: the deployment the directory was created with
  (a restart with another one is refused: results would change);
- ``output/balancer/``: the balancer's log.

A restart replays the journaled batches through a fresh
:class:`~skpub.app.engines.local.LocalPipeline` (the same lines, boundaries,
deployment and initial sample give the same outputs, decisions included:
DESIGN "Exactness") and appends only what the logs do not hold yet, so a
consumer's offsets stay valid across ``kill -9``: no gap, no duplicate.
The initial partitioning samples the first batch's lines.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import orjson
from prometheus_client import Counter, Gauge, Histogram, ProcessCollector

from skpub.app.engines.local import LocalPipeline
from skpub.app.engines.sink import complete_report, unique_letters
from skpub.app.journal import LineLog
from skpub.app.metrics import Metrics
from skpub.app.summary import BatchReport
from skpub.kernel.config import Deployment, deployment_from_json
from skpub.kernel.errors import ConfigError
from skpub.kernel.parts import delivery_lines
from skpub.kernel.records import stream_position
from skpub.kernel.storage import atomic_write_bytes
from skpub.kernel.text import load_vocabulary

CONTROL = ("subscribe", "unsubscribe", "snapshot")
"""Record types the daemon notes as they are accepted (definitions, snapshots by id)."""

LOGS = ("deliveries", "dead_letters", "snapshots")
"""The output logs a client reads, by the name of their route."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Limits:
    """What a client may ask of the daemon (every resource an input controls is bounded).

    ``max_body_bytes``: a ``POST /v1/records`` body; ``max_backlog``: ingest
    lines acknowledged but not yet in a batch (beyond it, 429); ``max_id``:
    characters of an id in a path; ``max_limit``, ``max_wait``: a read's
    entries and long-poll seconds; ``trigger``: seconds the data plane waits
    for lines before it cuts a batch of fewer than ``batch_size``.
    """

    max_body_bytes: int = 16 << 20
    max_backlog: int = 500_000
    max_id: int = 256
    max_limit: int = 10_000
    max_wait: float = 30.0
    trigger: float = 0.1


class DaemonMetrics:
    """What the daemon exports beyond a run's :class:`~skpub.app.metrics.Metrics`, in the same registry.

    Ingest (records acknowledged, backlog), batch wall time against the
    trigger, ingest-to-delivery latency (from a request's acknowledgement to
    the commit of the batch that holds its last line), HTTP requests and
    their durations per route, and the process's memory and CPU.
    """

    def __init__(self, metrics: Metrics, daemon: Daemon) -> None:
        r = metrics.registry
        ProcessCollector(registry=r)
        self.ingested = Counter("skpub_ingest_records", "Records acknowledged (durable in the ingest log)", registry=r)
        backlog = Gauge("skpub_ingest_backlog", "Records acknowledged and not yet processed", registry=r)
        backlog.set_function(lambda: daemon.backlog)
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

    Raises
    ------
    ConfigError
        If ``data`` was created with another deployment.
    OutputError
        If a log file in ``data`` is not skpub's.
    """

    def __init__(self, data: str | Path, deployment: Deployment, limits: Limits | None = None) -> None:
        self.data = Path(data)
        self.data.mkdir(parents=True, exist_ok=True)
        self.deployment = _claim(self.data / "deployment.json", deployment)
        self.limits = limits or Limits()
        self.vocabulary = load_vocabulary(deployment.vocabulary)
        self.ingest = LineLog(self.data / "ingest.log")
        self.batches = LineLog(self.data / "batches.log")
        self.logs = {name: LineLog(self.data / f"{name}.log") for name in LOGS}
        self.metrics = Metrics()
        self.served = DaemonMetrics(self.metrics, self)
        self._acks: deque[tuple[int, float]] = deque()  # (end position, acknowledged at) of requests in the backlog
        self._post_lock = threading.Lock()
        self.stopping = threading.Event()
        self.processed = 0  # ingest lines in batches that ran
        self.failure: BaseException | None = None
        self._produced = dict.fromkeys(LOGS, 0)
        self.snapshots: dict[str, tuple[int, int]] = {}  # accepted snapshot id -> (first entry, entries) of its lines
        self.definitions: dict[str, bytes] = {}  # live subscription id -> its accepted subscribe record
        self._controls: list[tuple[int, str, str, bytes]] = []  # the batch's (position, type, id, line) of CONTROL
        self._pipeline: LocalPipeline | None = None
        self._thread = threading.Thread(target=self._run, name="skpub-data-plane", daemon=True)

    # --- the client's side -------------------------------------------------------------------------------
    @property
    def backlog(self) -> int:
        """Ingest lines acknowledged and not yet processed."""
        return self.ingest.count - self.processed

    def post(self, lines: list[bytes]) -> tuple[int, int]:
        """Append ``lines`` to the ingest log durably; return the first position and the one after the last."""
        with self._post_lock:  # acknowledgements queue in position order
            first, end = self.ingest.append(lines)
            self._acks.append((end, time.monotonic()))
        self.served.ingested.inc(end - first)
        return first, end

    @property
    def ready(self) -> bool:
        """Whether the data plane has processed everything acknowledged."""
        return self.failure is None and self.processed == self.ingest.count

    # --- the data plane ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the data plane thread: replay the journaled batches, then follow the ingest log."""
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the batch in flight and stop the data plane."""
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for log in (self.ingest, self.batches, *self.logs.values()):
            log.close()

    def _run(self) -> None:
        try:
            for raw in self.batches.read(0, self.batches.count):
                entry = orjson.loads(raw)
                self._step(int(entry["batch"]), int(entry["end"]))
            while not self.stopping.is_set():
                if not self.ingest.wait(self.processed, self.limits.trigger) and not self.backlog:
                    continue
                time.sleep(self.limits.trigger if self.backlog < self.deployment.batch_size else 0.0)
                end = min(self.ingest.count, self.processed + self.deployment.batch_size)
                batch_id = self.batches.count
                self.batches.append([orjson.dumps({"batch": batch_id, "end": end})])
                self._step(batch_id, end)
        except BaseException as exc:  # noqa: BLE001 - the thread must report, /readyz turns false
            self.failure = exc
            raise

    def _step(self, batch_id: int, end: int) -> None:
        start = time.monotonic()
        lines = self.ingest.read(self.processed, end - self.processed)
        if self._pipeline is None:
            sample = lines[: self.deployment.sample_size]
            self._pipeline = LocalPipeline(self.data / "output", self.deployment, self.vocabulary, sample)
        found = ((i, line, _control(line)) for i, line in enumerate(lines))
        self._controls = [(stream_position(batch_id, i), *c, line) for i, line, c in found if c is not None]
        report = self._pipeline.step(batch_id, lines, self._sink)
        self.processed = end
        now = time.monotonic()
        self.served.batch_seconds.observe(now - start)
        while self._acks and self._acks[0][0] <= end:
            self.served.latency.observe(now - self._acks.popleft()[1])
        self.metrics.observe_batch(report)

    def _account_controls(self, rejected: set[int], snapshots: list[dict]) -> None:
        """Note the batch's accepted snapshots (where their lines are) and subscription definitions."""
        first, mine = self._produced["snapshots"], Tally(s["snapshot"] for s in snapshots)
        starts: dict[str, int] = {}
        for j, line in enumerate(snapshots):
            starts.setdefault(line["snapshot"], first + j)
        for pos, kind, sid, line in self._controls:
            if pos in rejected:
                continue
            if kind == "snapshot":
                self.snapshots[sid] = (starts.get(sid, first), mine.get(sid, 0))
            elif kind == "subscribe":
                self.definitions[sid] = line
            else:
                self.definitions.pop(sid, None)

    def result(self, sid: str) -> list | None:
        """Return ranked subscription ``sid``'s current result, ``[[object id, score or dist], ...]``, or None."""
        merged = self._pipeline.merge.subscriptions.get(sid) if self._pipeline is not None else None
        return None if merged is None else [[oid, value] for oid, value, _ in merged.result]

    def _sink(self, batch_id, deliveries, dead_letters, statistics, report: BatchReport, events, snapshots):  # noqa: ANN001
        """Append the batch's outputs the logs do not hold yet (a replay produces the same ones again)."""
        matches = [line for part in deliveries for line in delivery_lines(part).split(b"\n")[:-1]]
        dead = unique_letters(dead_letters)
        produced = {
            "deliveries": [*matches, *(orjson.dumps(e) for e in events)],
            "dead_letters": [orjson.dumps(d.to_json()) for d in dead],
            "snapshots": [orjson.dumps(s) for s in snapshots],
        }
        if self._controls:
            self._account_controls({d.pos for d in dead}, snapshots)
        for name, entries in produced.items():
            log, first = self.logs[name], self._produced[name]
            fresh = entries[max(0, log.count - first) :]
            if fresh:
                start = first + len(entries) - len(fresh)
                log.append([_with_offset(line, start + i + 1) for i, line in enumerate(fresh)])
            self._produced[name] = first + len(entries)
        self.served.delivered.labels(event="match").inc(len(matches))
        for event, count in Tally(e["event"] for e in events).items():
            self.served.delivered.labels(event=event).inc(count)
        return complete_report(report, len(produced["deliveries"]), dead, statistics)


def _control(line: bytes) -> tuple[str, str] | None:
    """Return ``(type, id)`` of a line that looks like a record of :data:`CONTROL`, else None.

    The engine decides whether it is accepted (it is unless it became a dead letter).
    """
    if not any(b'"%s"' % t.encode() in line for t in CONTROL):
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if isinstance(record, dict) and record.get("type") in CONTROL and isinstance(record.get("id"), str):
        return record["type"], record["id"]
    return None


def _with_offset(line: bytes, offset: int) -> bytes:
    """Return JSON object ``line`` with ``"offset"`` as its first field."""
    return b'{"offset":%d,%s' % (offset, line[1:]) if line != b"{}" else b'{"offset":%d}' % offset


def _claim(path: Path, deployment: Deployment) -> Deployment:
    """Record the data directory's deployment, or check it is the one recorded."""
    wanted = deployment.to_json()
    if path.exists():
        held = orjson.loads(path.read_bytes())
        if held != orjson.loads(orjson.dumps(wanted)):
            raise ConfigError(f"{path.parent} was created with another deployment ({path}); results would change")
        return deployment_from_json(held)
    atomic_write_bytes(path, orjson.dumps(wanted, option=orjson.OPT_INDENT_2))
    return deployment
