"""The evaluator host's frames and lifecycle (its Spark use is covered by every Spark engine test)."""

import math
import os
import socket
import subprocess
import threading
import time

import pytest

from skpub.evaluators import host
from skpub.evaluators.spark_processor import BatchOutcome, host_handler
from skpub.evaluators.state import EvaluatorState


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


def test_a_host_serves_until_the_process_it_watches_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(host.tempfile, "gettempdir", lambda: str(tmp_path))
    watched = subprocess.Popen(["sleep", "60"])
    address = host.HostAddress(7, watched.pid)
    path = address.socket_path
    served = []
    thread = threading.Thread(target=host.serve, args=(path, watched.pid, served.append))
    thread.start()
    try:
        for _ in range(200):
            if path.exists():
                break
            time.sleep(0.01)
        host.connect(address).close()
    finally:
        watched.kill()
        watched.wait()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(served) == 1
    assert not path.exists()
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_a_host_that_cannot_start_turns_hosts_off_in_that_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(host.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(host, "_FAILED_START", [])
    monkeypatch.setattr(host.sys, "executable", "/bin/false")
    address = host.HostAddress(3, 1)
    started = time.monotonic()
    with pytest.raises(host.HostError, match="did not start"):
        host.connect(address)
    assert time.monotonic() - started < host.START_SECONDS
    with pytest.raises(host.HostError, match="hosts are off"):
        host.connect(address)


def test_starting_a_host_sweeps_the_files_of_hosts_whose_jvm_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(host.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(host, "_FAILED_START", [])
    monkeypatch.setattr(host.sys, "executable", "/bin/false")
    gone = subprocess.Popen(["true"])
    gone.wait()
    directory = host.HostAddress(0, 1).socket_path.parent
    stale = [directory / f"{gone.pid}-e0.sock.lock", directory / f"{gone.pid}-e0.sock.log"]
    alive = directory / f"{os.getpid()}-e0.sock.lock"
    for f in [*stale, alive]:
        f.write_text("")
    with pytest.raises(host.HostError):
        host.connect(host.HostAddress(1, os.getpid()))
    assert not any(f.exists() for f in stale)
    assert alive.exists()
