"""Hosts: frames and lifecycle, the evaluator's and the sequencer's handlers (their Spark use: every Spark test)."""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from skpub.app.engines.spark_tasks import SequencerTask, sequencer_host_handler
from skpub.app.journal import SegmentFiles
from skpub.evaluators.batch import BatchOutcome, host_handler
from skpub.evaluators.state import EvaluatorState
from skpub.kernel import host


@pytest.fixture
def hosts_tmp(monkeypatch):
    """A short new directory that hosts take as the temporary directory (their sockets' parent).

    A Unix socket's path holds at most 107 bytes, and pytest's ``tmp_path``
    can be longer (under pytest-xdist, or a long user name).
    """
    path = tempfile.mkdtemp(prefix="skh-", dir=host.FALLBACK_TEMP_DIR)  # not under TMPDIR: it may be deep
    monkeypatch.setattr(host.tempfile, "gettempdir", lambda: path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_frames_round_trip_headers_and_blobs():
    a, b = socket.socketpair()
    with a, b:
        blobs = [b"", b"x" * 100_000, bytes(range(256))]
        host.send_message(a, {"op": "apply", "n": [1, 2.5, None]}, blobs)
        assert host.recv_message(b) == ({"op": "apply", "n": [1, 2.5, None]}, blobs)


@pytest.mark.parametrize("watermark", [-math.inf, 0.0, 1.5e9])
def test_state_and_outcome_messages_keep_the_clock_through_json(watermark):
    """A watermark of -inf (no object yet) survives a host message, whose JSON writes it as null."""
    a, b = socket.socketpair()
    with a, b:
        state = EvaluatorState({3: b"block"}, {7: b"segment"}, [b"ranked"], (0, watermark, "g1"))
        host.send_message(a, *state.to_message())
        assert EvaluatorState.from_message(*host.recv_message(b)) == state
        clock = (4, watermark, "")
        outcome = BatchOutcome({"evaluator": 1}, [], b"[]", b"", {}, {3: None}, {7: b"s"}, None, None, clock)
        host.send_message(a, *outcome.to_message())
        assert BatchOutcome.from_message(*host.recv_message(b)) == outcome


def test_a_cut_frame_is_an_error_not_a_hang():
    a, b = socket.socketpair()
    with b:
        a.sendall(host._LENGTH.pack(50) + b'{"op"')
        a.close()
        with pytest.raises(host.HostError, match="closed"):
            host.recv_message(b)


def test_an_oversized_frame_is_refused():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(host._LENGTH.pack(host.MAX_HEADER + 1))
        with pytest.raises(host.HostError, match="header"):
            host.recv_message(b)


def test_the_handler_answers_a_bad_request_with_an_error():
    a, b = socket.socketpair()
    with a, b:
        host.send_message(a, {"op": "apply"}, [])
        host_handler()(b)
        header, _ = host.recv_message(a)
        assert header["status"] == "error"


@pytest.mark.parametrize(
    "request_",
    [
        ({"op": "apply"}, []),
        ({"op": "sequence", "batch_id": 0, "task": {}}, [b"not arrow"]),
        ({"op": "sequence", "batch_id": 0, "task": {"files": []}}, []),
    ],
)
def test_the_sequencer_host_answers_a_bad_request_with_an_error(request_):
    a, b = socket.socketpair()
    with a, b:
        host.send_message(a, *request_)
        sequencer_host_handler()(b)
        header, blobs = host.recv_message(a)
        assert header["status"] == "error" and header["message"] and blobs == []


@pytest.mark.parametrize("files", [["/in/a.jsonl", "/in/b.jsonl"], SegmentFiles("/data/ingest", "log")])
def test_a_sequencer_task_travels_to_its_host_as_json(files):
    task = SequencerTask("/ckpt", "/out", "run-1", '{"evaluators": 2}', [5, 9], 4, files, entries=True)
    back = SequencerTask.from_json(json.loads(json.dumps(task.to_json())))
    assert back.to_json() == task.to_json()
    assert isinstance(back.files, type(files)) and back.entries is True and back.keys == [5, 9]


def _serving(path, watch, handle) -> threading.Thread:  # noqa: ANN001
    """Start :func:`host.serve` in a thread of this process; return once its socket exists."""
    thread = threading.Thread(target=host.serve, args=(path, watch, handle), daemon=True)
    thread.start()
    for _ in range(500):
        if path.exists():
            break
        time.sleep(0.01)
    assert path.exists()
    return thread


def test_a_host_serves_until_the_process_it_watches_ends(hosts_tmp, monkeypatch):
    watched = subprocess.Popen(["sleep", "60"])
    address = host.HostAddress("e7", watched.pid, "skpub.evaluators.host")
    path = address.socket_path
    served = []
    thread = _serving(path, watched.pid, served.append)
    try:
        with host.exchange(address):
            pass
    finally:
        watched.kill()
        watched.wait()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(served) == 1
    assert not path.exists()
    assert path.parent == Path(hosts_tmp) / f"skpub-hosts-{os.getuid()}"  # TMPDIR, where it is short enough
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_a_temporary_directory_too_deep_for_a_socket_puts_the_hosts_in_the_short_one(tmp_path, monkeypatch):
    """A cluster manager's deep TMPDIR (YARN's is under the container's directory) must not turn hosts off."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    short = tempfile.mkdtemp(prefix="skh-", dir=host.FALLBACK_TEMP_DIR)
    monkeypatch.setattr(host.tempfile, "gettempdir", lambda: str(deep))
    monkeypatch.setattr(host, "FALLBACK_TEMP_DIR", Path(short))
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host, "_STARTED", [])
    monkeypatch.setattr(host.sys, "executable", "/bin/false")  # no real host starts if the thread's is missed
    watched = subprocess.Popen(["sleep", "60"])
    try:
        address = host.HostAddress("sequencer", watched.pid, "skpub.app.engines.sequencer_host")
        path = address.socket_path
        assert path == Path(short) / f"skpub-hosts-{os.getuid()}" / f"{watched.pid}-sequencer.sock"
        served = []
        thread = _serving(path, watched.pid, served.append)
        with host.exchange(address):
            pass
        watched.kill()
        watched.wait()  # reaped: the host's watch sees it gone
        thread.join(timeout=10)
        assert served and not thread.is_alive() and not list(deep.iterdir())  # nothing made in the deep one
        monkeypatch.setattr(host, "FALLBACK_TEMP_DIR", deep)
        with pytest.raises(host.HostError, match="too long for a Unix socket"):
            _ = address.socket_path
    finally:
        watched.kill()
        watched.wait()
        shutil.rmtree(short, ignore_errors=True)


def test_a_host_socket_appears_under_its_name_only_once_it_listens(hosts_tmp, monkeypatch):
    """A client that finds the socket is never refused (it would start a second host): bind and listen, then link."""
    monkeypatch.setattr(host, "IDLE_SECONDS", 2.0)
    path = host.HostAddress("e5", os.getpid(), "skpub.evaluators.host").socket_path
    staging = path.with_suffix(".bind")
    staging.write_text("left by a host killed between its bind and its rename")
    links = []
    link = os.link

    def probing_link(src, dst) -> None:  # noqa: ANN001
        if str(dst) == str(path):
            assert not path.exists()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(src))  # refused (ConnectionRefusedError) if not listening yet
            links.append(src)
        link(src, dst)

    monkeypatch.setattr(host.os, "link", probing_link)
    thread = _serving(path, os.getpid(), lambda conn: None)
    thread.join(timeout=10)
    assert links == [staging]
    assert not staging.exists() and not path.exists()  # the host removed its socket when it ended


def test_a_host_never_takes_the_place_of_one_serving(hosts_tmp, monkeypatch):
    """A second host of the same role, started while one serves (a start that came late), leaves at once."""
    monkeypatch.setattr(host, "IDLE_SECONDS", 5.0)  # long enough to outlive the second start on a busy machine
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host, "_STARTED", [])
    monkeypatch.setattr(host.sys, "executable", "/bin/false")  # no real host starts if the first one is missed
    path = host.HostAddress("e5", os.getpid(), "skpub.evaluators.host").socket_path
    served = []
    first = _serving(path, os.getpid(), lambda conn: served.append("first"))
    inode = path.stat().st_ino
    second = threading.Thread(target=host.serve, args=(path, os.getpid(), lambda conn: served.append("second")))
    second.start()
    second.join(timeout=10)
    assert not second.is_alive() and path.stat().st_ino == inode and not path.with_suffix(".bind").exists()
    with host.exchange(host.HostAddress("e5", os.getpid(), "skpub.evaluators.host")):
        pass
    first.join(timeout=10)
    assert served == ["first"]


def test_a_host_that_cannot_start_turns_hosts_off_in_that_worker(hosts_tmp, monkeypatch):
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host.sys, "executable", "/bin/false")
    address = host.HostAddress("e3", 1, "skpub.evaluators.host")
    started = time.monotonic()
    with pytest.raises(host.HostError, match="did not start"):
        host.connect(address)
    assert time.monotonic() - started < host.START_SECONDS
    with pytest.raises(host.HostError, match="hosts of skpub.evaluators.host are off"):
        host.connect(address)
    other = host.HostAddress("sequencer", 1, "skpub.app.engines.sequencer_host")
    with pytest.raises(host.HostError, match="did not start"):  # another module's hosts are still tried
        host.connect(other)


def test_starting_a_host_sweeps_the_files_of_hosts_whose_jvm_is_gone(hosts_tmp, monkeypatch):
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host.sys, "executable", "/bin/false")
    gone = subprocess.Popen(["true"])
    gone.wait()
    directory = host.HostAddress("e0", 1, "skpub.evaluators.host").socket_path.parent
    stale = [directory / f"{gone.pid}-e0.sock.lock", directory / f"{gone.pid}-e0.sock.log"]
    alive = directory / f"{os.getpid()}-e0.sock.lock"
    for f in [*stale, alive]:
        f.write_text("")
    with pytest.raises(host.HostError):
        host.connect(host.HostAddress("e1", os.getpid(), "skpub.evaluators.host"))
    assert not any(f.exists() for f in stale)
    assert alive.exists()


STUCK_HOST = """
import sys, time
from pathlib import Path
from skpub.kernel.host import recv_message, serve

def handle(conn):
    recv_message(conn)
    time.sleep(600)  # reads the request, never answers

serve(Path(sys.argv[1]), int(sys.argv[2]), handle)
"""


def test_a_host_that_does_not_answer_is_stopped(tmp_path, hosts_tmp, monkeypatch):
    """A stuck host costs one fallback: it is killed and its socket removed, so the next task starts a new one."""
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host, "_STARTED", [])
    monkeypatch.setattr(host, "REQUEST_SECONDS", 5.0)  # the stuck host acknowledges first
    (tmp_path / "stuck_host.py").write_text(STUCK_HOST)
    monkeypatch.syspath_prepend(str(tmp_path))  # the host's PYTHONPATH is this process's path
    address = host.HostAddress("e5", os.getpid(), "stuck_host")
    try:
        with pytest.raises(host.HostError, match="did not answer in time"), host.exchange(address) as sock:
            host.send_message(sock, {"op": "apply"})
            host.recv_message(sock)
        [stuck] = host._STARTED
        assert stuck.wait(timeout=30) == -signal.SIGKILL
        assert not address.socket_path.exists()
    finally:
        for child in host._STARTED:
            child.kill()
            child.wait()


def test_stopping_a_stuck_host_never_removes_the_socket_of_a_successor(tmp_path, hosts_tmp, monkeypatch):
    """A successor that took the path while the task waited on a stuck host keeps its socket: the stuck host is
    killed, and the file is removed only if it is still the socket the task connected to (its inode read before
    connecting)."""
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host, "_STARTED", [])
    monkeypatch.setattr(host, "REQUEST_SECONDS", 5.0)  # the stuck host acknowledges first
    (tmp_path / "stuck_host.py").write_text(STUCK_HOST)
    monkeypatch.syspath_prepend(str(tmp_path))
    address = host.HostAddress("e7", os.getpid(), "stuck_host")
    path = address.socket_path
    successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(host.HostError, match="did not answer in time: stopped"), host.exchange(address) as sock:
            host.send_message(sock, {"op": "apply"})
            successor.bind(str(path.with_suffix(".next")))
            successor.listen(1)
            os.replace(path.with_suffix(".next"), path)  # a successor's socket takes the path meanwhile
            host.recv_message(sock)
        [stuck] = host._STARTED
        assert stuck.wait(timeout=30) == -signal.SIGKILL
        assert path.exists() and _bound_here(path), "the successor's socket is kept, and it listens"
    finally:
        successor.close()
        for child in host._STARTED:
            child.kill()
            child.wait()


def _bound_here(path) -> bool:  # noqa: ANN001
    """Whether a connection to the socket at ``path`` is accepted by a listener (the successor's)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_only_a_host_is_stopped(hosts_tmp, monkeypatch):
    """A peer that is not a host of the address (here: this test's process) is never killed, nor its socket removed."""
    monkeypatch.setattr(host, "REQUEST_SECONDS", 3.0)  # the thread acknowledges first, even on a busy machine
    monkeypatch.setattr(host, "IDLE_SECONDS", 6.0)  # the serving thread ends 6 s after its one connection
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host.sys, "executable", "/bin/false")  # no real host starts if the thread's is missed
    address = host.HostAddress("e6", os.getpid(), "skpub.evaluators.host")
    path = address.socket_path
    release = threading.Event()
    thread = _serving(path, os.getpid(), lambda conn: release.wait(30))
    try:
        with pytest.raises(host.HostError, match="did not answer in time"), host.exchange(address) as sock:
            host.send_message(sock, {"op": "apply"})
            host.recv_message(sock)
        assert path.exists()
    finally:
        release.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_peer_that_does_not_acknowledge_is_not_a_host(hosts_tmp, monkeypatch):
    """A frame other than the acknowledgement (a host of another protocol, say) is a fallback, not a request."""
    address = host.HostAddress("e4", os.getpid(), "skpub.evaluators.host")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address.socket_path))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            host.send_message(conn, {"status": "error", "message": "unknown op"})

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(host.HostError, match="not an acknowledgement"), host.exchange(address):
            pytest.fail("the body runs only after an acknowledgement")
    finally:
        thread.join(timeout=30)
        listener.close()


def test_a_host_whose_backlog_is_full_is_busy_not_replaced(hosts_tmp, monkeypatch):
    """A full backlog is a fallback: the live host's socket stays, and no second host of the role starts."""
    monkeypatch.setattr(host, "_FAILED_START", {})
    monkeypatch.setattr(host, "_STARTED", [])
    monkeypatch.setattr(host.sys, "executable", "/bin/false")  # a start attempted would say "did not start"
    address = host.HostAddress("e2", os.getpid(), "skpub.evaluators.host")
    path = address.socket_path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)  # never accepts: the queue fills
    inode = path.stat().st_ino
    queued = []
    try:
        while True:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            try:
                client.connect(str(path))
            except BlockingIOError:
                client.close()
                break
            queued.append(client)
        assert queued  # one connection waits in the queue
        with pytest.raises(host.HostError, match="busy"), host.exchange(address):
            pytest.fail("no exchange with a busy host")
        assert path.stat().st_ino == inode
        assert host._STARTED == []
    finally:
        for client in queued:
            client.close()
        listener.close()
