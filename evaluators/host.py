"""The evaluator host: one process per evaluator on an executor machine that keeps the evaluator hot.

Spark hands a task to whichever of its Python workers is free, so the task
of evaluator e often lands in another worker than the one that applied e's
last micro-batch, which must then rebuild e from the state store (on
``local[2]`` that was half of the tasks, about a second each on the 100k
window of benchmark (e)). A host is a long-lived process that holds e
across micro-batches: the worker sends it the file of the batch's routed
rows (the sequencer task wrote it) and the state store's version, the host
reads and applies them (rebuilding e first, from state the
worker sends, only when its copy is not of that version) and returns what
the worker writes to the state store. The state store stays the truth: a
host that dies, or answers with an error, costs a rebuild, never a result
(the worker then applies the batch itself).

Messages are frames on a Unix socket in a directory only this user can
enter: a JSON header and binary blobs (the state documents as they are);
nothing is unpickled. Every read has a timeout, so
a stuck host or client costs a fallback, never a hang. A host serves one
connection at a time (two tasks of one evaluator, as with speculation or
two queries in one JVM, wait for each other; the version check keeps them
exact), writes no output itself (the task writes what it returns), and
exits, between requests, when the process it watches (the executor's JVM)
is gone or after :data:`IDLE_SECONDS` without a request. A worker whose
host cannot start applies its batches itself from then on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from skpub.evaluators.errors import EvaluatorError

IDLE_SECONDS = 600.0
"""A host exits after this long without a request."""
REQUEST_SECONDS = 1800.0
"""The longest a task waits for its host's answer (a micro-batch's evaluation), seconds."""
READ_SECONDS = 120.0
"""The longest a host waits for a message of its client, seconds."""
START_SECONDS = 30.0
"""The longest a task waits for a host it started to listen, seconds."""
MAX_SOCKET_PATH = 100
"""Unix socket paths are limited to about 107 bytes; a longer temp dir means no hosts."""
MAX_HEADER = 1 << 26
MAX_BLOBS = 1 << 20
_LENGTH = struct.Struct("!Q")


class HostError(EvaluatorError):
    """The host could not be reached, or failed: the caller applies the batch itself."""


def send_message(sock: socket.socket, header: dict, blobs: list[bytes] = ()) -> None:  # type: ignore[assignment]
    """Send one frame: the header as JSON, then the blobs, each preceded by its length (bytes)."""
    head = orjson.dumps(header)
    sock.sendall(_LENGTH.pack(len(head)) + head + _LENGTH.pack(len(blobs)))
    for blob in blobs:
        sock.sendall(_LENGTH.pack(len(blob)))
        sock.sendall(blob)


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
    TimeoutError
        If the socket's timeout passes first.
    """
    stream = sock.makefile("rb")
    size = _LENGTH.unpack(_read_exact(stream, 8))[0]
    if size > MAX_HEADER:
        raise HostError(f"a header of {size} bytes")
    header = orjson.loads(_read_exact(stream, size))
    count = _LENGTH.unpack(_read_exact(stream, 8))[0]
    if count > MAX_BLOBS:
        raise HostError(f"{count} blobs")
    blobs = [_read_exact(stream, _LENGTH.unpack(_read_exact(stream, 8))[0]) for _ in range(count)]
    return header, blobs


def _host_directory() -> Path:
    """Return the directory of this user's host sockets, made private to the user.

    Raises
    ------
    HostError
        If it exists and is not this user's alone.
    """
    directory = Path(tempfile.gettempdir()) / f"skpub-hosts-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise HostError(f"{directory} is not a directory private to this user")
    return directory


def _watched_pid() -> int:
    """Return the process a host outlives not: the executor JVM (the parent of the worker's pyspark daemon)."""
    daemon = os.getppid()
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{daemon}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    return daemon


@dataclass
class HostAddress:
    """Where evaluator ``evaluator``'s host listens, and the process whose end ends it."""

    evaluator: int
    watch: int

    @property
    def socket_path(self) -> Path:
        """The host's Unix socket (its directory is private to this user).

        Raises
        ------
        HostError
            If the directory is not private, or the path too long for a Unix socket.
        """
        path = _host_directory() / f"{self.watch}-e{self.evaluator}.sock"
        if len(str(path)) > MAX_SOCKET_PATH:
            raise HostError(f"{path} is too long for a Unix socket")
        return path


def host_for(evaluator: int) -> HostAddress:
    """Return the address of evaluator ``evaluator``'s host for this executor."""
    return HostAddress(evaluator, _watched_pid())


_STARTED: list[subprocess.Popen] = []
"""Hosts this worker started (reaped when they exit)."""
_FAILED_START: list[str] = []
"""Why a host this worker started did not answer: then the worker uses no hosts any more."""


def connect(address: HostAddress) -> socket.socket:
    """Connect to the host at ``address``, starting it first if none runs.

    Reads on the connection time out after :data:`REQUEST_SECONDS`.

    Raises
    ------
    HostError
        If this worker could not start a host before, or no host answers
        within :data:`START_SECONDS` (or the one started exits).
    """
    if _FAILED_START:
        raise HostError(f"evaluator hosts are off in this worker: {_FAILED_START[0]}")
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
                [sys.executable, "-P", "-m", "skpub.evaluators.host", str(path), str(address.watch)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
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
                    _FAILED_START.append(f"the host at {path} did not start ({exc}; see {path}.log)")
                    raise HostError(_FAILED_START[0]) from None
                time.sleep(0.02)


def _sweep(directory: Path) -> None:
    """Remove the files of hosts whose JVM is gone (named ``<jvm pid>-e<evaluator>.sock[.lock|.log]``)."""
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


def _connected(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    sock.settimeout(REQUEST_SECONDS)
    return sock


def serve(path: Path, watch: int, handle) -> None:  # noqa: ANN001
    """Serve requests at ``path`` one connection at a time until ``watch`` ends or :data:`IDLE_SECONDS` pass.

    ``handle(conn)`` answers one connection.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    bound = path.stat().st_ino
    listener.listen(4)
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
            with conn:
                conn.settimeout(READ_SECONDS)
                handle(conn)
            last = time.monotonic()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == bound:  # not a successor's socket
                path.unlink()


if __name__ == "__main__":
    from skpub.evaluators.spark_processor import host_handler

    serve(Path(sys.argv[1]), int(sys.argv[2]), host_handler())
