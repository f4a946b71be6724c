"""A ``skpub serve`` subprocess on loopback, driven over real HTTP (daemon and dashboard tests)."""

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

STALL_SECONDS = 300.0
"""A daemon whose readiness reports no progress for this long is stuck (a restarted Spark daemon moves on within
seconds idle and within half a minute under load 6: docs/benchmarks.md (g), "Restart to ready")."""


PROGRESS = ("phase", "starting", "processed", "committed_batch", "run_batch")
"""The ``/readyz`` fields that move while a daemon makes progress."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A ``skpub serve`` subprocess on loopback: on a port the kernel picks (``--listen 127.0.0.1:0``, the port read
    from the ``serving`` log line), or on ``port`` (a restart where a client waits at the same URL)."""

    def __init__(self, data, config, token="t0ken", engine="local", extra=(), start_seconds=60.0, port=None):
        env = {**os.environ, "SKPUB_TOKEN": token}
        cmd = [sys.executable, "-m", "skpub.app.cli", "serve", "--data", str(data), "--config", str(config),
               "--listen", f"127.0.0.1:{port or 0}", "--engine", engine, *extra]  # fmt: skip
        fd, name = tempfile.mkstemp(".err", "serve-", Path(data).parent)  # a file: Spark's JVM may write much
        self.errors = Path(name)
        with os.fdopen(fd, "wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + start_seconds  # until its HTTP API answers
        self.url = f"http://127.0.0.1:{port}" if port else self._serving_url(deadline)
        self.port = int(self.url.rsplit(":", 1)[1])
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        while True:  # a daemon still building its data plane queues the connection: wait at most what is left
            wait = max(0.1, min(5.0, deadline - time.monotonic()))
            try:
                if self.http.get("/healthz", timeout=wait).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            self._alive(deadline)
            time.sleep(0.1)

    def _alive(self, deadline: float) -> None:
        """Fail (the daemon killed) if it ended, or did not start by ``deadline``."""
        if self.proc.poll() is not None or time.monotonic() > deadline:
            self.proc.kill()
            self.proc.wait(60)
            raise RuntimeError(f"the daemon did not start: {self.stderr()}")

    def _serving_url(self, deadline: float) -> str:
        """The URL of the daemon's ``serving`` log line (JSON lines on its standard error), once written whole."""
        while True:
            for line in self.errors.read_bytes().split(b"\n")[:-1]:  # the last piece may be a line half written
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # not skpub's: the JVM's, say
                if isinstance(event, dict) and event.get("event") == "serving":
                    return event["url"]
            self._alive(deadline)
            time.sleep(0.1)

    def stderr(self) -> str:
        """The end of the daemon's standard error (Spark's JVM may be writing it: undecodable bytes replaced)."""
        return self.errors.read_bytes()[-3000:].decode("utf-8", "replace")

    def post(self, lines):
        reply = self.http.post("/v1/records", content="".join(line + "\n" for line in lines))
        assert reply.status_code == 202, reply.text
        return reply.json()

    def wait_ready(self, stall: float = STALL_SECONDS) -> dict:
        """Wait until the daemon has processed everything acknowledged; return its ``/readyz`` body.

        Waits as long as the daemon reports progress (its phase, what it starts, processed lines or committed
        batch move; a restarted Spark daemon on a busy machine takes minutes), and fails once nothing moved for
        ``stall`` seconds, or the process ended.
        """
        last, moved = None, time.monotonic()
        while True:
            reply = self.http.get("/readyz")
            body = reply.json()
            if reply.status_code == 200:
                return body
            progress = tuple(body.get(key) for key in PROGRESS)
            if progress != last:
                last, moved = progress, time.monotonic()
            assert self.proc.poll() is None and body.get("phase") != "failed", self.stderr()
            assert time.monotonic() - moved < stall, f"no progress for {stall} s: {body}\n{self.stderr()}"
            time.sleep(0.1)

    def read(self, name, after=0):
        out = []
        while True:
            page = self.http.get(f"/v1/{name}", params={"after": after, "limit": 500}).json()
            out += page[name]
            if page["next"] == after:
                return out
            after = page["next"]


def start_prometheus(config, tsdb, port: int) -> subprocess.Popen:
    """Start a real Prometheus with ``config`` on ``127.0.0.1:port`` (the caller terminates it)."""
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class WebhookReceiver:
    """A webhook receiver on loopback (a real HTTP server): keeps every body it takes; 500 while ``failing`` is set.

    Bodies signed with ``X-Skpub-Signature`` are checked against ``secret`` (``bad_signatures`` counts misses).
    """

    def __init__(self, secret: bytes = b"", on_body=None) -> None:  # noqa: ANN001 - a callable of the body
        self.bodies: list[dict] = []
        self.failing = threading.Event()
        self.refused = 0
        self.bad_signatures = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.failing.is_set():
                    receiver.refused += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                signature = self.headers.get("X-Skpub-Signature")
                if signature is not None:
                    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
                    receiver.bad_signatures += signature != expected
                doc = {"target": self.headers["X-Skpub-Target"], "signed": signature is not None, **json.loads(body)}
                receiver.bodies.append(doc)
                if on_body is not None:
                    on_body(doc)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/in"

    def lines(self, target: str) -> list[dict]:
        return [line for body in self.bodies if body["target"] == target for line in body["deliveries"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
