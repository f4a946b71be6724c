"""MQTT, NATS and Redis targets against real servers started here (Debian's ``mosquitto``, ``nats-server``,
``redis-server``; each test skips, saying so, when its server is not installed: ``.ci/run`` installs them).

Every delivery of a mixed stream reaches the server at least once, in offset order per subscription, across a
restart of the server in the middle (the target fails, then resumes from its cursor) and a kill -9 of the
daemon (a ``skpub serve`` process) while it pushes the backlog, then its restart; the consumer's set,
de-duplicated by offset, equals the daemon's delivery log and the oracle's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.served import Served, free_port
from tests.test_targets import check_against_oracle, check_at_least_once_in_order, wait_until
from tests.workloads import deployment, random_workload, ranked_workload

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Broker:
    """A server process on a loopback port, restartable on the same port and data."""

    def __init__(self, argv: list[str], port: int) -> None:
        self.argv, self.port = argv, port
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._listening, 30)

    def _listening(self) -> bool:
        import socket

        assert self.proc.poll() is None, f"{self.argv[0]} exited with {self.proc.returncode}"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        self.proc.terminate()  # a graceful stop: each server keeps what it persisted
        self.proc.wait(30)


def needs(binary: str):  # noqa: ANN201
    return pytest.mark.skipif(shutil.which(binary) is None, reason=f"needs {binary} (apt-get install; .ci/run does)")


def redis_broker(tmp_path: Path) -> Broker:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--appendonly", "yes", "--appendfsync", "always", "--save", ""]  # fmt: skip
    return Broker(argv, port)


def nats_broker(tmp_path: Path) -> Broker:
    port = free_port()
    return Broker(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")], port)


def mosquitto_broker(tmp_path: Path) -> Broker:
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {tmp_path}/\n"
        "max_queued_messages 0\n"
    )
    return Broker(["mosquitto", "-c", str(config)], port)


class MqttConsumer:
    """A persistent-session QoS 1 subscriber: the broker keeps its messages while it is away."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.messages: list[dict] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="consumer", clean_session=False)
        self.subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda client, *_: client.subscribe("skpub/deliveries/#", qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.reconnect_delay_set(0.1, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _client, _userdata, message) -> None:  # noqa: ANN001
        with self.lock:
            self.messages.append(json.loads(message.payload))

    def lines(self) -> list[dict]:
        with self.lock:
            return list(self.messages)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def redis_lines(port: int) -> list[dict]:
    import redis

    client = redis.Redis(port=port)
    try:
        return [json.loads(fields[b"line"]) for _, fields in client.xrange("skpub:deliveries")]
    finally:
        client.close()


def nats_lines(port: int) -> list[dict]:
    import nats

    async def read() -> list[dict]:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        name = await js.find_stream_name_by_subject("skpub.deliveries.x")
        info = await js.stream_info(name)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            out.append(json.loads((await js.get_msg(name, seq)).data))
        await nc.close()
        return out

    return asyncio.run(read())


def run_through_restarts(tmp_path: Path, broker: Broker, target: dict, lines_now) -> list[dict]:  # noqa: ANN001
    """Run a mixed stream through a ``skpub serve`` with ``target``: the server restarts in the middle; the
    daemon is killed with SIGKILL once it pushes the backlog the restart left, then restarted. Return the
    daemon's committed deliveries once the server has them all (``lines_now()`` reads what the server has),
    after checking them against the oracle."""
    dep = deployment(evaluators=3, batch_size=40)
    config = tmp_path / "dep.json"
    config.write_text(json.dumps(dep.to_json()))
    lines = random_workload(seed=61, n=500) + ranked_workload(seed=62, n=300)
    parts = [lines[:300], lines[300:600], lines[600:]]
    served = Served(tmp_path / "data", config)
    try:
        reply = served.http.put("/v1/targets/out", json=target)
        assert reply.status_code == 201, reply.text
        served.post(parts[0])
        served.wait_ready()
        wait_until(lambda: served.http.get("/v1/targets/out").json()["lag"] == 0)
        before = len({d["offset"] for d in lines_now()})
        broker.stop()
        served.post(parts[1])
        served.wait_ready()
        wait_until(lambda: served.http.get("/v1/targets/out").json()["failed"] > 0)
        assert served.http.get("/v1/targets/out").json()["lag"] > 0
        broker.start()
        # the backlog is being pushed, 10 lines a send: the kill comes as soon as some arrived (often mid-backlog;
        # how far the push got by then depends on the machine, so it is not asserted: a timing test would be flaky)
        wait_until(lambda: len({d["offset"] for d in lines_now()}) > before)
    finally:
        served.proc.kill()  # kill -9 while it pushes
        served.proc.wait(60)
        served.http.close()
    served = Served(tmp_path / "data", config)
    try:
        served.post(parts[2])
        served.wait_ready()
        expected = served.read("deliveries")
        wait_until(lambda: served.http.get("/v1/targets/out").json()["cursor"] == len(expected))
        wait_until(lambda: {d["offset"] for d in lines_now()} >= {d["offset"] for d in expected})
        check_against_oracle(expected, lines, dep)
        return expected
    finally:
        served.proc.kill()
        served.proc.wait(60)
        served.http.close()
        broker.stop()


@needs("redis-server")
def test_a_redis_stream_holds_every_delivery_once_across_restarts(tmp_path):
    broker = redis_broker(tmp_path)
    url = f"redis://127.0.0.1:{broker.port}/0"
    target = {"kind": "redis", "url": url, "batch": 10}  # small sends: the kill comes in the middle of the backlog
    expected = run_through_restarts(tmp_path, broker, target, lambda: redis_lines(broker.port))
    broker.start()
    try:
        got = redis_lines(broker.port)
        assert got == expected  # ids are offsets: a resend is refused, so each line once, in order
    finally:
        broker.stop()


@needs("nats-server")
def test_a_nats_jetstream_subject_gets_every_delivery_across_restarts(tmp_path):
    broker = nats_broker(tmp_path)
    target = {
        "kind": "nats",
        "url": f"nats://127.0.0.1:{broker.port}",
        "subject": "skpub.deliveries.{sub}",
        "batch": 10,
    }
    got: list[dict] = []

    def now() -> list[dict]:
        got[:] = nats_lines(broker.port)
        return got

    expected = run_through_restarts(tmp_path, broker, target, now)
    check_at_least_once_in_order(got, expected)


@needs("mosquitto")
def test_an_mqtt_subscriber_gets_every_delivery_across_restarts(tmp_path):
    broker = mosquitto_broker(tmp_path)
    consumer = MqttConsumer(broker.port)
    try:
        assert consumer.subscribed.wait(30)  # the SUBACK: the subscription is in place before the first publish
        target = {"kind": "mqtt", "url": f"mqtt://127.0.0.1:{broker.port}", "batch": 10}
        expected = run_through_restarts(tmp_path, broker, target, consumer.lines)
        check_at_least_once_in_order(consumer.lines(), expected)
    finally:
        consumer.close()
