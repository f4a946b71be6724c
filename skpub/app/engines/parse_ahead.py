"""The local engine's parse worker: the next micro-batch's parse stage runs in a second process.

The parse stage (:meth:`~skpub.router.locate.Locator.locate_items`: parse,
validate, normalize, locate) depends on a micro-batch's lines and its routing
epoch alone, never on the stream before it (``skpub.router.locate``). So
while the engine's process runs micro-batch ``b``'s serial stage, evaluators
and sink, one worker process parses and locates ``b + 1``, as the Spark
engine's parse tasks run apart from its sequencer task. On the sparse
GeoNames stream the parse stage is about half of a micro-batch's CPU
(docs/benchmarks.md (s)), so on two cores the two halves overlap.

The worker is ``python -m skpub.app.engines.parse_ahead FD``, our own
interpreter and module (never the caller's main module, which a
``multiprocessing`` spawn would import again), talking over a socket pair in
:func:`~skpub.kernel.host.send_message` frames: a JSON header and binary
blobs, nothing unpickled. A request carries a batch's lines (joined by newlines,
which lines as read never hold), its routing epoch's JSON when the worker does not
hold it yet, and the deployment's JSON in the first request; the answer, the
located rows as an Arrow IPC stream (:func:`~skpub.kernel.wire.table_bytes`),
the dead letters and the worker's CPU seconds. Requests and answers
alternate: the engine takes batch ``b``'s answer before it sends ``b + 1``,
so one batch is in flight and the worker holds at most one micro-batch of
lines more than the engine does.

Results never depend on the worker: the serial stage uses an answer only for
the batch and epoch it asked for
(:meth:`~skpub.router.dispatch.Router.route_many`), and should the worker
fail, time out or die, that batch and every later one are parsed in the
engine's process, as without a worker (:attr:`ParseAhead.failure` says why).
The epoch a batch is parsed under is known a batch ahead
(:meth:`~skpub.app.engines.local.LocalPipeline.epoch_for`).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from skpub.kernel.config import Deployment, deployment_from_text
from skpub.kernel.host import HostError, recv_message, send_message
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import bytes_table, table_buffer
from skpub.router.epoch import RoutingEpoch
from skpub.router.locate import LocatedItems, Locator

CHUNK_LINES = 8_192
"""The worker parses a batch in runs of this many lines and reads the engine's claim before each (parsing a batch
of 100,000 sparse lines in runs of 8,192 costs about 4% more than in one)."""
MIN_CLAIM_LINES = 4_096
"""The engine claims lines from the worker only if this many or more are left past the worker's current run."""
_SHARED_BYTES = 16
MIN_BATCH_LINES = 10_000
"""Below this many lines a micro-batch is parsed in the engine's process: the worker's start (about a second of
imports) and each batch's hand-over would cost more than the overlap wins."""
Locate = Callable[[Sequence[bytes], int, RoutingEpoch, int], LocatedItems]
"""The engine's own parse stage, ``locate(lines, batch_id, epoch, first)`` (``Router.locate``)."""
ANSWER_SECONDS = 600.0
"""The longest the engine waits for the worker's answer on one micro-batch, seconds; then it parses itself."""


PARSE_WORKER_ENV = "SKPUB_PARSE_WORKER"
"""Set to ``0``, the local engine parses every batch in its own process (as on one CPU)."""


def worth_a_worker(batch_lines: int, cpus: int | None = None) -> bool:
    """Whether a run whose micro-batches hold ``batch_lines`` lines should parse ahead in a worker.

    Only with at least two CPUs available to this process (``cpus``; by
    default ``os.sched_getaffinity``), batches of at least
    :data:`MIN_BATCH_LINES`, and :data:`PARSE_WORKER_ENV` not ``0``.
    """
    if os.environ.get(PARSE_WORKER_ENV) == "0":
        return False
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus >= 2 and batch_lines >= MIN_BATCH_LINES


@dataclass
class _Pending:
    """A batch sent to the worker and not answered yet."""

    batch_id: int
    lines: list[bytes]
    epoch: RoutingEpoch


class ParseAhead:
    """One worker process that runs the parse stage of the micro-batch after the one being routed.

    For each batch ``b``: :meth:`take` ``b``'s result (None: parse it
    yourself), :meth:`submit` ``b + 1``, then route ``b``. :meth:`close` at
    the end, or use it as a context manager. The worker starts at the first
    submit. ``locate`` is the engine's own parse stage
    (:meth:`~skpub.router.dispatch.Router.locate`), which :meth:`take` runs
    on the lines it claims from the worker.
    """

    def __init__(self, deployment: Deployment, locate: Locate) -> None:
        self._deployment_json: str | None = json.dumps(deployment.to_json())
        self._locate = locate
        self._process: subprocess.Popen | None = None
        self._socket: socket.socket | None = None
        self._shared: np.ndarray | None = None  # [progress, limit] of the batch the worker parses
        self._pending: _Pending | None = None
        self._epoch_sent: int | None = None
        self._handover = 0.0
        self.failure: str | None = None
        """Why the worker stopped being used (None while it is): every batch is then parsed in the engine."""
        self.claimed = 0
        """Lines the engine parsed itself out of those sent to the worker (its share of the work)."""

    def submit(self, batch_id: int, lines: list[bytes], epoch: RoutingEpoch) -> None:
        """Send micro-batch ``batch_id`` (``lines``, as read) to the worker, to be parsed under ``epoch``.

        Any answer not yet taken is dropped first. Never raises: a failure
        is kept in :attr:`failure` and the worker stopped.
        """
        if self.failure is not None:
            return
        start = time.thread_time()
        try:
            if self._pending is not None:
                self.take(self._pending.batch_id)
            if self._socket is None:
                self._start()
            header = {"batch_id": batch_id, "epoch": epoch.number, "chunk": CHUNK_LINES}
            if self._deployment_json is not None:
                header["deployment"], self._deployment_json = self._deployment_json, None
            if epoch.number != self._epoch_sent:
                header["epoch_json"] = json.dumps(epoch.to_json())
            if self._shared is not None:
                self._shared[:] = (0, len(lines))  # set before the worker can read them for this batch
            header["cut"], blobs = pack_lines(lines)
            assert self._socket is not None
            send_message(self._socket, header, blobs)
            self._pending, self._epoch_sent = _Pending(batch_id, lines, epoch), epoch.number
        except Exception as exc:  # noqa: BLE001 - the engine's process parses instead
            self._fail(f"sending batch {batch_id}: {type(exc).__name__}: {exc}")
        self._handover += time.thread_time() - start

    def take(self, batch_id: int) -> LocatedItems | None:
        """Return micro-batch ``batch_id``'s parse stage; None if it was not sent or the worker failed.

        If the worker has not answered yet, the engine first claims two
        thirds of the lines the worker has not reached (past the run it is
        in), parses them itself, and then waits for the worker's
        answer on the rest (at most :data:`ANSWER_SECONDS`). The CPU seconds
        include the worker's, the engine's claimed part and its hand-over.
        Never raises.
        """
        pending = self._pending
        if pending is None or pending.batch_id != batch_id or self._socket is None:
            return None
        self._pending = None
        try:
            own = self._claim(pending)
            start = time.thread_time()
            header, blobs = recv_message(self._socket)
            if header.get("status") != "ok":
                self._fail(f"batch {batch_id}: {header.get('error', 'no status')}")
                return None
            items = bytes_table(blobs[0])
            letters = [DeadLetter(*letter) for letter in header["dead_letters"]]
            cpu = float(header["cpu_seconds"]) + self._handover + time.thread_time() - start
            self._handover = 0.0
            head = LocatedItems(batch_id, int(header["epoch"]), 0, int(header["lines"]), items, letters, cpu)
            if own is None:
                return head
            if head.lines < own.first:
                raise RuntimeError(f"the worker stopped at line {head.lines}, before the engine's claim {own.first}")
            return LocatedItems.concat([head, own.since(head.lines)]) if head.lines < own.first + own.lines else head
        except Exception as exc:  # noqa: BLE001 - the engine's process parses instead
            code = self._process.poll() if self._process is not None else None
            died = f" (the worker exited with {code})" if code is not None else ""
            self._fail(f"batch {batch_id}: {type(exc).__name__}: {exc}{died}")
            return None

    def _claim(self, pending: _Pending) -> LocatedItems | None:
        """Claim and parse two thirds of what the worker has left of ``pending``, if worth it; else None.

        Two thirds, not half: the worker also ends the run it is in, then
        writes and sends its rows, while the engine only reads them
        (measured on the sparse stream: the engine's wait at the second
        steady batch 0.11-0.18 s with half, 0.04-0.09 s with two thirds).
        """
        shared, n = self._shared, len(pending.lines)
        if shared is None or select.select([self._socket], [], [], 0)[0]:
            return None  # no shared words, or the answer is (being) sent
        left = n - int(shared[0]) - CHUNK_LINES  # the worker ends the chunk it is in
        if left < MIN_CLAIM_LINES:
            return None
        first = n - (2 * left) // 3
        shared[1] = first  # the worker starts no chunk at or past it, and ends its chunk there
        self.claimed += n - first
        return self._locate(pending.lines[first:], pending.batch_id, pending.epoch, first)

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        words = _shared_words()
        passed = [theirs.fileno()] if words is None else [theirs.fileno(), words[0]]
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-P", "-m", __name__, *map(str, passed)],
                stdin=subprocess.DEVNULL,
                pass_fds=passed,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                start_new_session=True,  # an interrupt reaches the engine, which stops the worker
            )
        finally:
            theirs.close()
            if words is not None:
                os.close(words[0])
        ours.settimeout(ANSWER_SECONDS)
        self._socket = ours
        self._shared = None if words is None else words[1]

    def _fail(self, why: str) -> None:
        self.failure = why
        self.close()

    def close(self) -> None:
        """Stop the worker: close its socket (it exits at the end of its input), kill it if it lingers; idempotent."""
        self._pending = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def __enter__(self) -> ParseAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shared_words() -> tuple[int, np.ndarray] | None:
    """Return an anonymous shared memory file's descriptor and its two int64 words; None where there is none.

    Linux's ``memfd_create``: nothing on a file system to clean up, and the
    worker maps it through the inherited descriptor.
    """
    if not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("skpub-parse-ahead")
    os.ftruncate(fd, _SHARED_BYTES)
    return fd, np.frombuffer(mmap.mmap(fd, _SHARED_BYTES), np.int64)


# --------------------------------------------------------------------------- in the worker process


def pack_lines(lines: list[bytes]) -> tuple[str, list[bytes]]:
    """Return how ``lines`` are cut and the blobs that carry them, for :func:`unpack_lines`.

    Joined by newlines when none holds one (lines as read never do: one
    C-speed split in the worker), else their int64 lengths and their bytes.
    """
    joined = b"\n".join(lines)
    if lines and joined.count(b"\n") == len(lines) - 1:
        return "newline", [joined]
    return "lengths", [np.fromiter(map(len, lines), np.int64, len(lines)).tobytes(), b"".join(lines)]


def unpack_lines(cut: str, blobs: list[bytes]) -> list[bytes]:
    """Return the lines :func:`pack_lines` packed.

    Raises
    ------
    ValueError
        If ``cut`` is unknown, or the lengths are negative or do not add up
        to the bytes sent.
    """
    if cut == "newline":
        return blobs[0].split(b"\n")
    if cut != "lengths":
        raise ValueError(f"unknown cut {cut!r}")
    lengths, data = blobs
    sizes = np.frombuffer(lengths, np.int64)
    if (sizes < 0).any() or int(sizes.sum()) != len(data):
        raise ValueError("line lengths do not cut the lines' bytes")
    ends = np.cumsum(sizes).tolist()
    return [data[a:b] for a, b in zip([0, *ends][:-1], ends, strict=True)]


def serve(sock: socket.socket, shared: np.ndarray | None) -> None:
    """Answer requests on ``sock`` until the engine closes it (the worker's main loop).

    ``shared`` are the words [progress, limit] of :class:`ParseAhead`, or
    None (then every batch is parsed whole). A request that fails is
    answered with its error; the engine then parses itself and stops the
    worker.
    """
    deployment = vocabulary = epoch = None
    tune_gc()
    while True:
        try:
            header, blobs = recv_message(sock)
        except HostError:
            return  # the engine closed the socket: the run is over
        start = time.thread_time()
        try:
            if "deployment" in header:
                deployment = deployment_from_text(header["deployment"])
                vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
            if "epoch_json" in header:
                epoch = RoutingEpoch.from_json(json.loads(header["epoch_json"]))
            if deployment is None or vocabulary is None or epoch is None or epoch.number != header["epoch"]:
                raise RuntimeError(f"the worker holds no deployment or no routing epoch {header['epoch']}")
            lines = unpack_lines(header["cut"], blobs)
            locator = Locator(deployment, vocabulary, epoch.table)
            located = _locate_until_claimed(locator, lines, header["batch_id"], epoch.number, header["chunk"], shared)
            answer = {
                "status": "ok",
                "epoch": epoch.number,
                "lines": located.lines,
                "dead_letters": [(d.pos, d.line, d.reason, d.message) for d in located.dead_letters],
            }
            data = memoryview(table_buffer(located.items))  # the IPC stream as Arrow wrote it, not copied
            answer["cpu_seconds"] = time.thread_time() - start
            send_message(sock, answer, [data])
        except Exception as exc:  # noqa: BLE001 - reported to the engine, which parses itself
            with contextlib.suppress(OSError, HostError):
                send_message(sock, {"status": "error", "error": f"{type(exc).__name__}: {exc}"})


def _locate_until_claimed(
    locator: Locator, lines: list[bytes], batch_id: int, epoch: int, chunk: int, shared: np.ndarray | None
) -> LocatedItems:
    """Parse ``lines`` from the first in runs of ``chunk``, each ending at the engine's claim; return those parsed.

    Before each run the claim (``shared[1]``) is read: no run starts at or
    past it, and a run ends there; ``shared[0]`` is set to the lines done
    after each run. Without ``shared``, all the lines in one run.
    """
    if shared is None or not lines:
        return locator.locate_items(lines, batch_id, epoch)
    parts, done = [], 0
    while done < min(len(lines), int(shared[1])):
        end = min(done + chunk, len(lines), int(shared[1]))
        parts.append(locator.locate_items(lines[done:end], batch_id, epoch, done))
        done = end
        shared[0] = done
    return LocatedItems.concat(parts)


def _main(argv: list[str]) -> None:
    """Serve on the socket and shared-memory descriptors given on the command line (:meth:`ParseAhead._start`)."""
    shared = None
    if len(argv) > 1:
        shared = np.frombuffer(mmap.mmap(int(argv[1]), _SHARED_BYTES), np.int64)
    serve(socket.socket(fileno=int(argv[0])), shared)


if __name__ == "__main__":
    _main(sys.argv[1:])
