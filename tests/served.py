"""A ``skpub serve`` subprocess on loopback, driven over real HTTP (daemon and dashboard tests)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A ``skpub serve`` subprocess on loopback."""

    def __init__(self, data, config, token="t0ken", engine="local", extra=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SKPUB_TOKEN": token}
        cmd = [sys.executable, "-m", "skpub.app.cli", "serve", "--data", str(data), "--config", str(config),
               "--listen", f"127.0.0.1:{self.port}", "--engine", engine, *extra]  # fmt: skip
        self.errors = Path(data).parent / f"serve-{self.port}.err"  # a file: Spark's JVM may write much
        with self.errors.open("wb") as err:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {self.errors.read_text()}")
            time.sleep(0.1)

    def post(self, lines):
        reply = self.http.post("/v1/records", content="".join(line + "\n" for line in lines))
        assert reply.status_code == 202, reply.text
        return reply.json()

    def wait_ready(self):
        deadline = time.monotonic() + 180
        while self.http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.errors.read_text()[-3000:]
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
