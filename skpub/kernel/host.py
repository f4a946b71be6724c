"""Hosts: long-lived processes beside a Spark executor that keep a task's state hot between micro-batches.

Spark hands a task to whichever of its Python workers is free (a FIFO
queue), so a stateful task often lands in another worker than the one that
ran its last micro-batch, which must then rebuild the state, and every
worker that ever ran it keeps a copy. A host is one process per role and
executor JVM (an evaluator, :mod:`skpub.evaluators.host`; the sequencer,
:mod:`skpub.app.engines.sequencer_host`) that holds the state across
micro-batches: the task sends it a request, the host answers; a host writes
only in the checkpoint (idempotent files, the same on a replay), never in
the output, which the task writes from the answer. The durable state stays the truth: a host that
dies, or answers with an error, costs a rebuild, never a result (the task
then runs the work itself).

Messages are frames on a Unix socket in a directory only this user can
enter: a JSON header and binary blobs; nothing is unpickled. Every read has
a timeout, so a stuck host or client costs a fallback, never a hang. A
host acknowledges a connection when it takes it up; one that then does not
answer in time is stopped (:func:`exchange`), so the next task starts a
fresh one rather than waiting for it again. A host
serves one connection at a time (two tasks of one role, as with speculation
or two queries in one JVM, wait for each other), and exits, between
requests, when the process it watches (the executor's JVM) is gone or after
:data:`IDLE_SECONDS` without a request. A worker whose host of an entry
module cannot start uses no host of that module from then on.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from skpub.kernel.errors import SkpubError

IDLE_SECONDS = 600.0
"""A host exits after this long without a request."""
REQUEST_SECONDS = 1800.0
"""The longest a task waits for its host's answer (a micro-batch's work), seconds."""
READ_SECONDS = 120.0
"""The longest a host waits for a message of its client, seconds."""
HANDLE_SECONDS = 2 * REQUEST_SECONDS
"""A host that spends longer on one connection exits (its watchdog): no task is left to stop it."""
ACKNOWLEDGEMENT = {"status": "serving"}
"""The frame a host sends when it takes a connection up."""
START_SECONDS = 30.0
"""The longest a task waits for a host it started to listen, seconds."""
MAX_SOCKET_PATH = 100
"""Unix socket paths are limited to about 107 bytes (the host's own ``.bind`` name included, with a margin)."""
FALLBACK_TEMP_DIR = Path("/tmp")
"""Where host sockets go when the temporary directory's path is too long for one (a YARN container's, say)."""
MAX_HEADER = 1 << 26
MAX_BLOBS = 1 << 20
_LENGTH = struct.Struct("!Q")


class HostError(SkpubError):
    """The host could not be reached, or failed: the caller does the work itself."""


class HostTimeout(HostError):
    """A read or write on a host's connection timed out."""


def send_message(sock: socket.socket, header: dict, blobs: Sequence[bytes | memoryview] = ()) -> None:
    """Send one frame: the header as JSON, then the blobs (bytes, or views of bytes), each preceded by its length.

    Raises
    ------
    HostTimeout
        If the socket's timeout passes first.
    """
    head = orjson.dumps(header)
    try:
        sock.sendall(_LENGTH.pack(len(head)) + head + _LENGTH.pack(len(blobs)))
        for blob in blobs:
            sock.sendall(_LENGTH.pack(memoryview(blob).nbytes))
            sock.sendall(blob)
    except TimeoutError:
        raise HostTimeout("a write on the host connection timed out") from None


def _read_exact(stream, n: int) -> bytes:  # noqa: ANN001
    data = stream.read(n)
    if len(data) != n:
        raise HostError("the other end closed the connection")
    return data


def recv_message(sock: socket.socket) -> tuple[dict, list[bytes]]:
    """Receive one :func:`send_message` frame.

    Raises
    ------
    HostError
        If the connection ends early or the frame exceeds the bounds.
    HostTimeout
        If the socket's timeout passes first.
    """
    stream = sock.makefile("rb")  # closed here: an open one keeps the socket's descriptor open after its close()
    try:
        size = _LENGTH.unpack(_read_exact(stream, 8))[0]
        if size > MAX_HEADER:
            raise HostError(f"a header of {size} bytes")
        header = orjson.loads(_read_exact(stream, size))
        count = _LENGTH.unpack(_read_exact(stream, 8))[0]
        if count > MAX_BLOBS:
            raise HostError(f"{count} blobs")
        blobs = [_read_exact(stream, _LENGTH.unpack(_read_exact(stream, 8))[0]) for _ in range(count)]
    except TimeoutError:
        raise HostTimeout("a read on the host connection timed out") from None
    finally:
        stream.close()
    return header, blobs


def _hosts_under(base: Path) -> Path:
    """Return the directory of this user's host sockets under ``base`` (not made: :func:`_host_directory`)."""
    return base / f"skpub-hosts-{os.getuid()}"


def _host_directory(directory: Path) -> Path:
    """Return ``directory`` (of :func:`_hosts_under`), made private to the user.

    Raises
    ------
    HostError
        If it exists and is not this user's alone.
    """
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise HostError(f"{directory} is not a directory private to this user")
    return directory


def watched_pid() -> int:
    """Return the process a host outlives not: the executor JVM (the parent of the worker's pyspark daemon)."""
    daemon = os.getppid()
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{daemon}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    return daemon


@dataclass(frozen=True)
class HostAddress:
    """Where the host of ``role`` listens, the process whose end ends it, and the module it runs.

    Attributes
    ----------
    role : str
        The state it holds, unique per executor: ``e<evaluator>`` or ``sequencer``.
    watch : int
        The executor JVM's pid (:func:`watched_pid`).
    module : str
        The host's entry module, run as ``python -m module SOCKET WATCH``.
    """

    role: str
    watch: int
    module: str

    @property
    def socket_path(self) -> Path:
        """The host's Unix socket, in a directory private to this user.

        That directory is in the temporary directory (``TMPDIR``), or in
        :data:`FALLBACK_TEMP_DIR` when this socket's path would be too long
        there (in bytes): a cluster manager may give each executor a deep
        temporary directory (YARN's is under the container's), where no host
        could listen. The choice is per socket, so with a ``TMPDIR`` of
        middling depth a longer role may go to the fallback and a shorter
        one not; every caller computes the same path for an address.

        Raises
        ------
        HostError
            If the directory is not private, or the path is too long for a Unix socket in both places.
        """
        name = f"{self.watch}-{self.role}.sock"
        for base in (Path(tempfile.gettempdir()), FALLBACK_TEMP_DIR):
            directory = _hosts_under(base)
            if len(os.fsencode(directory / name)) <= MAX_SOCKET_PATH:
                return _host_directory(directory) / name
        raise HostError(f"{name} is too long for a Unix socket even in {FALLBACK_TEMP_DIR}")


def use_hosts() -> bool:
    """Whether stateful tasks run in hosts; ``SKPUB_HOSTS=0`` (read where the task is made, on the driver): no."""
    return os.environ.get("SKPUB_HOSTS", "1") != "0"


_STARTED: list[subprocess.Popen] = []
"""Hosts this worker started (reaped when they exit)."""
_FAILED_START: dict[str, str] = {}
"""Entry module -> why a host of it that this worker started did not answer: then the worker uses none of it."""


def module_command(module: str, *args: str) -> list[str]:
    """Return the command line that runs ``module`` with ``args`` in this interpreter (``-P``: no script folder)."""
    return [sys.executable, "-P", "-m", module, *args]


def module_environment() -> dict[str, str]:
    """Return this process's environment with its import path, so a child imports skpub as this process does."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def connect(address: HostAddress) -> tuple[socket.socket, int]:
    """Connect to the host at ``address``, starting it first if none runs.

    Returns the socket, whose reads time out after :data:`REQUEST_SECONDS`,
    and the inode of the socket file, read just before connecting (see
    :func:`_connected`).

    Raises
    ------
    HostError
        If this worker could not start a host before, the host's backlog is
        full, or no host answers within :data:`START_SECONDS` (or the one
        started exits).
    """
    failed = _FAILED_START.get(address.module)
    if failed is not None:
        raise HostError(f"hosts of {address.module} are off in this worker: {failed}")
    for child in list(_STARTED):
        if child.poll() is not None:
            _STARTED.remove(child)
    path = address.socket_path
    with contextlib.suppress(OSError):
        return _connected(path)
    _sweep(path.parent)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            return _connected(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with open(f"{path}.log", "wb") as log:
            child = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                module_command(address.module, str(path), str(address.watch)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                env=module_environment(),
                start_new_session=True,
                close_fds=True,
            )
        _STARTED.append(child)
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                return _connected(path)
            except OSError as exc:
                if child.poll() is not None or time.monotonic() > deadline:
                    _FAILED_START[address.module] = f"the host at {path} did not start ({exc}; see {path}.log)"
                    raise HostError(_FAILED_START[address.module]) from None
                time.sleep(0.02)


@contextlib.contextmanager
def exchange(address: HostAddress) -> Iterator[socket.socket]:
    """Connect to the host at ``address`` (:func:`connect`) and wait for it to take the connection up.

    Yields the connected socket, on which the caller sends its request and
    reads the answers; each read or write times out after
    :data:`REQUEST_SECONDS`. A host that took the connection up (its
    acknowledgement came) and then lets a read or write time out is
    *stopped*: killed, and its socket removed if it is still the one
    connected to, so the next task starts a fresh host (the checkpoint is
    the truth: a host's state is a cache; a host killed in the middle of a
    checkpoint write leaves no partial file, writes being atomic). A host
    still busy with another connection is left alone.

    Raises
    ------
    HostError
        If the host cannot be reached, is busy past :data:`REQUEST_SECONDS`,
        or does not answer in time, or the connection fails.
    """
    try:
        sock, inode = connect(address)
    except OSError as exc:
        raise HostError(f"the host of {address.role} could not be reached: {exc}") from None
    try:
        path = address.socket_path
        try:
            header, _ = recv_message(sock)  # the host's acknowledgement: it serves this connection now
        except (HostError, OSError, ValueError) as exc:
            raise HostError(f"the host at {path} did not take the connection up: {exc}") from None
        if header != ACKNOWLEDGEMENT:
            raise HostError(f"the host at {path} answered {header!r}, not an acknowledgement")
        try:
            yield sock
        except HostTimeout:
            stopped = _stop(sock, path, inode, address.module)
            raise HostError(f"the host at {path} did not answer in time{': stopped' if stopped else ''}") from None
        except OSError as exc:
            raise HostError(f"the connection to the host at {path} failed: {exc}") from None
    finally:
        sock.close()


def _stop(sock: socket.socket, path: Path, inode: int, module: str) -> bool:
    """Kill the host at the other end of ``sock``; remove its socket ``path`` if it is still ``inode``.

    The host's pid and uid come from the kernel (``SO_PEERCRED``); only a
    process of this user whose command line runs ``module`` on ``path`` is
    killed, through a pidfd opened before the check (a pid reused meanwhile
    is not hit; where the kernel has no pidfds, by pid). The socket is
    removed only when the kill was sent and the path still names the socket
    connected to (not a successor's). Returns whether the kill was sent.
    """
    killed = False
    with contextlib.suppress(OSError):
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if pid > 0 and uid == os.getuid():
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # no pidfds (Linux before 5.3)
                fd = None
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if os.fsencode(module) in argv and os.fsencode(path) in argv:
                    if fd is None:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed = True
            finally:
                if fd is not None:
                    os.close(fd)
    with contextlib.suppress(OSError):
        if killed and path.stat().st_ino == inode:
            path.unlink()
    return killed


def _sweep(directory: Path) -> None:
    """Remove the files of hosts whose JVM is gone (named ``<jvm pid>-<role>.sock[.lock|.log]`` or ``.bind``)."""
    for entry in directory.iterdir():
        pid = entry.name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                entry.unlink()
        except OSError:
            continue


def _connected(path: Path) -> tuple[socket.socket, int]:
    """Connect to the socket at ``path``; reads and writes time out after :data:`REQUEST_SECONDS`.

    Returns the socket and the socket file's inode, read before connecting:
    if a successor replaced the file in between, the inode is the old one,
    so stopping the host connected to never removes the successor's socket
    (read after connecting, it could name the successor's).

    Raises
    ------
    HostError
        If a host listens there but its backlog is full (Linux refuses a
        Unix socket's connect at once then, ``EAGAIN``): the host is alive,
        so the caller falls back rather than start a second one.
    OSError
        If no host listens there (no socket, or a socket nobody accepts on).
    """
    inode = path.stat().st_ino
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(START_SECONDS)  # before connecting: a full backlog is then EAGAIN at once (busy), not a wait
    try:
        sock.connect(str(path))
    except BlockingIOError as exc:
        sock.close()
        raise HostError(f"the host at {path} is busy: its backlog is full ({exc})") from None
    except OSError:
        sock.close()
        raise
    sock.settimeout(REQUEST_SECONDS)
    return sock, inode


def serve(path: Path, watch: int, handle) -> None:  # noqa: ANN001
    """Serve requests at ``path`` one connection at a time until ``watch`` ends or :data:`IDLE_SECONDS` pass.

    ``handle(conn)`` answers one connection, after the host's
    acknowledgement (:data:`ACKNOWLEDGEMENT`, which :func:`exchange` waits
    for); a client gone, or a connection that fails, ends that connection
    only. A connection handled for longer than :data:`HANDLE_SECONDS` ends
    the host (``faulthandler`` writes its threads' stacks to its log): the
    task that would stop it may be gone, and the next tasks would only
    wait behind it.

    The socket is bound and listening under a staging name and then linked
    to ``path``: a client that finds ``path`` finds a host that listens (a
    refused connection there means the host is gone, not starting). If a
    socket is at ``path`` already, another host serves there, and this one
    returns at once.
    """
    staging = path.with_suffix(".bind")  # as long as the path, and swept like it when the JVM is gone
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()  # left by a host killed between its bind and its link
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(staging))
    os.chmod(staging, 0o600)
    bound = staging.stat().st_ino
    listener.listen(4)
    try:
        os.link(staging, path)  # the socket appears where clients look only once it listens, and never over another
    except FileExistsError:  # a host started since serves there (the starter removes a stale socket first)
        listener.close()
        return
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    listener.settimeout(1.0)
    last = time.monotonic()
    try:
        while time.monotonic() - last < IDLE_SECONDS:
            try:
                os.kill(watch, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(HostError, OSError):  # a client gone before its turn
                conn.settimeout(READ_SECONDS)
                send_message(conn, ACKNOWLEDGEMENT)  # the client's clock for a stuck host starts here
                faulthandler.dump_traceback_later(HANDLE_SECONDS, exit=True)  # to the log, then exit
                try:
                    handle(conn)
                finally:
                    faulthandler.cancel_dump_traceback_later()
            last = time.monotonic()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == bound:  # not a successor's socket
                path.unlink()
