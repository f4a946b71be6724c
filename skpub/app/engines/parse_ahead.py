"""The local engine's parse worker: the next micro-batch's parse stage runs in a second process.

The parse stage (:meth:`~skpub.router.locate.Locator.locate_items`: parse,
validate, normalize, locate) depends on a micro-batch's lines and its routing
epoch alone, never on the stream before it (``skpub.router.locate``). So
while the engine's process runs micro-batch ``b``'s serial stage, evaluators
and sink, one worker process parses and locates ``b + 1``, as the Spark
engine's parse tasks run apart from its sequencer task. On the sparse
GeoNames stream the parse stage is about half of a micro-batch's CPU
(docs/benchmarks.md (s)), so on two cores the two halves overlap.

The worker is ``python -P -m skpub.app.engines.parse_ahead SOCKET_FD [MEMFD_FD]``,
our own interpreter and module (never the caller's main module, which a
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
import dataclasses
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
from skpub.kernel.host import HostError, module_command, module_environment, recv_message, send_message
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import bytes_table, table_buffer
from skpub.router.epoch import RoutingEpoch
from skpub.router.locate import LocatedItems, Locator

RUN_LINES = 8_192
"""The worker parses a batch in runs of this many lines and reads the engine's claim before each (parsing a batch
of 100,000 sparse lines in runs of 8,192 costs about 4% more than in one)."""
MIN_CLAIM_LINES = 4_096
"""The engine claims lines from the worker only if this many or more are left past the worker's current run."""
_SHARED_BYTES = 16
MIN_BATCH_LINES = 10_000
"""Below this many lines a micro-batch is parsed in the engine's process: the worker's start (about a second of
imports) and each batch's exchange would cost more than the overlap wins."""
Locate = Callable[[Sequence[bytes], int, RoutingEpoch, int], LocatedItems]
"""The engine's own parse stage, ``locate(lines, batch_id, epoch, first)`` (``Router.locate``)."""
MAX_SENT_BYTES = 128 << 20
"""A batch of more bytes of lines is parsed in the engine's process: sent, it would be held three more times (joined,
received, cut) besides the engine's own copy, where micro-batches may reach 512 MiB (``kernel.inputs.BATCH_BYTES``)."""
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
        self._words: SharedWords | None = None
        self._pending: _Pending | None = None
        self._epoch_sent: int | None = None
        self._exchange_cpu = 0.0  # this process's CPU sending and reading since the last answer taken
        self.failure: str | None = None
        """Why the worker stopped being used (None while it is): every batch is then parsed in the engine."""
        self.claimed = 0
        """Lines the engine claimed from the worker and parsed itself (the worker may have parsed a few too)."""

    def submit(self, batch_id: int, lines: list[bytes], epoch: RoutingEpoch) -> None:
        """Send micro-batch ``batch_id`` (``lines``, as read) to the worker, to be parsed under ``epoch``.

        An answer not taken is read and dropped first. A batch of more than
        :data:`MAX_SENT_BYTES` is not sent (:meth:`take` then returns None
        for it). Never raises: a failure is kept in :attr:`failure` and the
        worker stopped for good.
        """
        start = time.thread_time()
        try:
            if self._pending is not None:
                self._answer(self._pending)
            if self.failure is not None or sum(map(len, lines)) + len(lines) > MAX_SENT_BYTES:
                return  # failed, or too large to hold again: the engine parses it
            if self._socket is None:
                self._start()
            header = {"batch_id": batch_id, "epoch": epoch.number, "run": RUN_LINES}
            if self._deployment_json is not None:
                header["deployment"], self._deployment_json = self._deployment_json, None
            if epoch.number != self._epoch_sent:
                header["epoch_json"] = json.dumps(epoch.to_json())
            if self._words is not None:
                self._words.words[:] = (0, len(lines))  # set before the worker can read them for this batch
            header["cut"], blobs = pack_lines(lines)
            assert self._socket is not None
            send_message(self._socket, header, blobs)
            self._pending, self._epoch_sent = _Pending(batch_id, lines, epoch), epoch.number
        except Exception as exc:  # noqa: BLE001 - the engine's process parses instead
            self._fail(f"sending batch {batch_id}: {type(exc).__name__}: {exc}")
        finally:
            self._exchange_cpu += time.thread_time() - start

    def take(self, batch_id: int) -> LocatedItems | None:
        """Return micro-batch ``batch_id``'s parse stage; None if it was not sent or the worker failed.

        If the worker has not answered yet, the engine first claims three
        quarters of the lines the worker has not reached (past the run it is
        in), parses them itself, and then waits for the worker's answer on
        the rest (at most :data:`ANSWER_SECONDS`). The CPU seconds are the
        worker's (without sending its answer), the engine's claimed part and
        this process's side of the exchange. Never raises.
        """
        pending = self._pending
        if pending is None or pending.batch_id != batch_id or self.failure is not None:
            return None
        try:
            own = self._claim(pending)
        except Exception as exc:  # noqa: BLE001 - the engine's process parses instead
            self._fail(f"claiming from batch {batch_id}: {type(exc).__name__}: {exc}")
            return None
        head = self._answer(pending)
        if head is None or own is None:
            return head
        if head.lines < own.first:
            self._fail(f"batch {batch_id}: the worker stopped at line {head.lines}, before the claim at {own.first}")
            return None
        if head.lines == len(pending.lines):  # the worker got there first: the claimed part is only CPU spent
            return dataclasses.replace(head, cpu_seconds=head.cpu_seconds + own.cpu_seconds)
        try:
            return LocatedItems.concat([head, own.since(head.lines)])
        except ValueError as exc:
            self._fail(f"batch {batch_id}: {exc}")
            return None

    def _answer(self, pending: _Pending) -> LocatedItems | None:
        """Read the worker's answer on ``pending``: the lines it parsed from the first; None if it failed."""
        self._pending = None
        start = time.thread_time()
        try:
            assert self._socket is not None
            header, blobs = recv_message(self._socket)
            if header.get("status") != "ok":
                self._fail(f"batch {pending.batch_id}: {header.get('error', 'no status')}")
                return None
            items = bytes_table(blobs[0])
            letters = [DeadLetter(*letter) for letter in header["dead_letters"]]
            cpu = float(header["cpu_seconds"]) + self._exchange_cpu + time.thread_time() - start
            self._exchange_cpu = 0.0
            return LocatedItems(pending.batch_id, int(header["epoch"]), 0, int(header["lines"]), items, letters, cpu)
        except Exception as exc:  # noqa: BLE001 - the engine's process parses instead
            code = self._process.poll() if self._process is not None else None
            died = f" (the worker exited with {code})" if code is not None else ""
            self._fail(f"batch {pending.batch_id}: {type(exc).__name__}: {exc}{died}")
            return None

    def _claim(self, pending: _Pending) -> LocatedItems | None:
        """Claim and parse three quarters of what the worker has left of ``pending``, if worth it; else None.

        More than half: the worker also ends the run it is in, then writes
        and sends its rows, while the engine only reads them (measured on
        the sparse stream, the engine's wait at the second steady batch:
        0.11-0.18 s with half, 0.04-0.09 s with two thirds (benchmarks (s));
        the engine's whole cycle at that batch, its wait and its routing,
        0.333-0.413 s (median 0.37 s) with two thirds, 0.327-0.409 s (median
        0.345 s) with three quarters over twelve runs each (benchmarks (u)).
        """
        words, n = self._words, len(pending.lines)
        if words is None or _readable(self._socket):
            return None  # no shared words, or the answer is (being) sent
        left = n - int(words.words[0]) - RUN_LINES  # the worker ends the run it is in
        if left < MIN_CLAIM_LINES:
            return None
        first = n - (3 * left) // 4
        words.words[1] = first  # the worker starts no run at or past it, and ends its run there
        self.claimed += n - first
        return self._locate(pending.lines[first:], pending.batch_id, pending.epoch, first)

    def _start(self) -> None:
        words = SharedWords.create()
        ours, theirs = socket.socketpair()
        passed = [theirs.fileno()] if words is None else [theirs.fileno(), words.fd]
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                module_command(__name__, *map(str, passed)),
                stdin=subprocess.DEVNULL,
                pass_fds=passed,
                env=module_environment(),
                start_new_session=True,  # an interrupt reaches the engine, which stops the worker
            )
        except BaseException:
            ours.close()
            if words is not None:
                words.close()
            raise
        finally:
            theirs.close()
            if words is not None:
                words.close_fd()
        ours.settimeout(ANSWER_SECONDS)
        self._socket, self._words = ours, words

    def _fail(self, why: str) -> None:
        self.failure = why
        self.close()

    def close(self) -> None:
        """Stop the worker and free what it shares; idempotent.

        The engine claims every line of a batch being parsed (the worker
        stops at its next run) and shuts the socket down (the worker ends at
        its next read or write), then waits for the worker, and kills it
        after 10 seconds. Nothing is sent to a closed one.
        """
        self._pending = None
        if self.failure is None:
            self.failure = "closed"
        if self._words is not None:
            self._words.words[1] = 0  # a batch being parsed stops at its next run
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._words is not None:
            self._words.close()
            self._words = None

    def __enter__(self) -> ParseAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _readable(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has something to read now (``poll``: any descriptor number, unlike ``select``)."""
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class SharedWords:
    """Two int64 words the engine and its worker both map: the worker's progress and the engine's claim.

    An anonymous shared memory file (Linux's ``memfd_create``): nothing on
    a file system to clean up; the worker maps it through the inherited
    descriptor. Aligned 8-byte stores and loads; a stale read only makes a
    claim smaller or a run end later, which :class:`ParseAhead` allows for.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._memory = mmap.mmap(fd, _SHARED_BYTES)
        self.words = np.frombuffer(self._memory, np.int64)
        """``[progress, claim]``: lines the worker has parsed, and the line the engine claimed from."""

    @classmethod
    def create(cls) -> SharedWords | None:
        """Return new words, or None where they cannot be made (no ``memfd_create``, or it fails)."""
        if not hasattr(os, "memfd_create"):
            return None
        try:
            fd = os.memfd_create("skpub-parse-ahead")
        except OSError:
            return None
        try:
            os.ftruncate(fd, _SHARED_BYTES)
            return cls(fd)
        except OSError:
            os.close(fd)
            return None

    def close_fd(self) -> None:
        """Close the descriptor (the mapping stays); idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Close the descriptor and unmap the words; idempotent."""
        self.close_fd()
        self.words = np.zeros(2, np.int64)  # the view of the mapping goes before the mapping
        self._memory.close()


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


def serve(sock: socket.socket, words: SharedWords | None) -> None:
    """Answer requests on ``sock`` until the engine closes it (the worker's main loop).

    ``words`` are :class:`SharedWords` with the engine, or None (then every
    batch is parsed whole). A request that fails is answered with its
    error; the engine then parses itself and stops the worker. The CPU
    seconds answered count reading the request and parsing, not sending
    the answer.
    """
    deployment = vocabulary = epoch = None
    tune_gc()
    while True:
        start = time.thread_time()  # waiting costs no thread CPU; reading the request does
        try:
            header, blobs = recv_message(sock)
        except (HostError, OSError):
            return  # the engine closed the socket (a reset, when it left an answer unread): the run is over
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
            located = _locate_until_claimed(locator, lines, header["batch_id"], epoch.number, header["run"], words)
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
    locator: Locator, lines: list[bytes], batch_id: int, epoch: int, run: int, words: SharedWords | None
) -> LocatedItems:
    """Parse ``lines`` from the first in runs of ``run`` lines, up to the engine's claim; return what was parsed.

    Before each run the claim is read: no run starts at or past it, and a
    run ends there; the progress is set after each run. Without ``words``,
    all the lines in one run.
    """
    if words is None or not lines:
        return locator.locate_items(lines, batch_id, epoch)
    parts, done = [], 0
    while done < min(len(lines), int(words.words[1])):
        end = min(done + run, len(lines), int(words.words[1]))
        parts.append(locator.locate_items(lines[done:end], batch_id, epoch, done))
        done = end
        words.words[0] = done
    return LocatedItems.concat(parts) if parts else locator.locate_items([], batch_id, epoch)


def _main(argv: list[str]) -> None:
    """Serve on the socket and shared-memory descriptors given on the command line (:meth:`ParseAhead._start`)."""
    serve(socket.socket(fileno=int(argv[0])), SharedWords(int(argv[1])) if len(argv) > 1 else None)


if __name__ == "__main__":
    _main(sys.argv[1:])
