"""The evaluator host: one process per evaluator on an executor machine that keeps the evaluator hot.

Spark hands a task to whichever of its Python workers is free, so the task
of evaluator e often lands in another worker than the one that applied e's
last micro-batch, which must then rebuild e from the state store (on
``local[2]`` that was half of the tasks, about a second each on the 100k
window of benchmark (e)). A host is a long-lived process that holds e
across micro-batches: the worker sends it the batch's rows and the state
store's version, the host applies them (rebuilding e first, from state the
worker sends, only when its copy is not of that version) and returns what
the worker writes to the state store. The state store stays the truth: a
host that dies, or answers with an error, costs a rebuild, never a result
(the worker then applies the batch itself).

Messages are frames on a Unix socket in a directory only this user can
enter: a JSON header and binary blobs (Arrow IPC for rows, the state
documents as they are); nothing is unpickled. A host serves one connection
at a time (Spark never runs two tasks of one evaluator at once), and exits
when the process it watches (the executor's JVM) is gone or after
:data:`IDLE_SECONDS` without a request.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa

from skpub.evaluators.errors import EvaluatorError

IDLE_SECONDS = 600.0
"""A host exits after this long without a request."""
MAX_HEADER = 1 << 26
MAX_BLOBS = 1 << 20
_LENGTH = struct.Struct("!Q")


class HostError(EvaluatorError):
    """The host could not be reached, or failed: the caller applies the batch itself."""


def send_message(sock: socket.socket, header: dict, blobs: list[bytes] = ()) -> None:  # type: ignore[assignment]
    """Send one frame: the header as JSON, then the blobs, each preceded by its length (bytes)."""
    head = orjson.dumps(header)
    parts = [_LENGTH.pack(len(head)), head, _LENGTH.pack(len(blobs))]
    for blob in blobs:
        parts += [_LENGTH.pack(len(blob)), blob]
    sock.sendall(b"".join(parts))


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


def table_bytes(table: pa.Table) -> bytes:
    """Return ``table`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def bytes_table(data: bytes) -> pa.Table:
    """Return the table of an Arrow IPC stream."""
    return pa.ipc.open_stream(data).read_all()


def _host_directory() -> Path:
    """Return the directory of this user's host sockets, made private to the user.

    Raises
    ------
    HostError
        If it exists and is not this user's alone.
    """
    directory = Path(tempfile.gettempdir()) / f"skpub-hosts-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise HostError(f"{directory} is not private to this user")
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
        """The host's Unix socket (its directory is private to this user)."""
        return _host_directory() / f"{self.watch}-e{self.evaluator}.sock"


def host_for(evaluator: int) -> HostAddress:
    """Return the address of evaluator ``evaluator``'s host for this executor."""
    return HostAddress(evaluator, _watched_pid())


def connect(address: HostAddress, timeout: float = 30.0) -> socket.socket:
    """Connect to the host at ``address``, starting it first if none runs.

    Raises
    ------
    HostError
        If no host answers within ``timeout`` seconds.
    """
    path = address.socket_path
    with contextlib.suppress(OSError):
        return _connected(path)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            return _connected(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        log = open(f"{path}.log", "wb")  # noqa: SIM115 - handed to the child
        subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "skpub.evaluators.host", str(path), str(address.watch)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                return _connected(path)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise HostError(f"no evaluator host answered at {path}: {exc}") from None
                time.sleep(0.02)


def _connected(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def serve(path: Path, watch: int, handle) -> None:  # noqa: ANN001
    """Serve requests at ``path`` one connection at a time until ``watch`` ends or :data:`IDLE_SECONDS` pass.

    ``handle(conn)`` answers one connection.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
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
                conn.settimeout(None)
                handle(conn)
            last = time.monotonic()
    finally:
        listener.close()
        for leftover in (path, Path(f"{path}.lock")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        log = Path(f"{path}.log")
        with contextlib.suppress(OSError):
            if not log.stat().st_size:
                log.unlink()


if __name__ == "__main__":
    from skpub.evaluators.spark_processor import host_handler

    serve(Path(sys.argv[1]), int(sys.argv[2]), host_handler())
