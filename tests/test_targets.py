"""Delivery targets (SEMANTICS section 7): every delivery reaches each target at least once, in offset order per
subscription, through failures of the target and restarts of the daemon; a failing target pauses alone.

The webhook receiver is a real HTTP server on loopback (``http.server``), which can be told to fail.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest
from fastapi.testclient import TestClient

from skpub.app import targets as targets_module
from skpub.app.api import create_app
from skpub.app.daemon import Daemon, Limits
from tests.served import WebhookReceiver
from tests.workloads import deployment, random_workload, ranked_workload

SECRET = b"hush"


@pytest.fixture
def receiver():
    r = WebhookReceiver(SECRET)
    yield r
    r.close()


def open_daemon(data):  # noqa: ANN001, ANN201
    daemon = Daemon(data, deployment(evaluators=3, batch_size=40), Limits(trigger=0.01, max_backlog=100_000))
    daemon.start()
    return daemon, TestClient(create_app(daemon, None))


def wait_until(condition, seconds: float = 60.0) -> None:  # noqa: ANN001
    """Poll ``condition`` (a progress check, not a timing assertion) until it holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def settled(daemon, client, names):  # noqa: ANN001, ANN201
    """Whether the daemon processed everything and every named target took every committed delivery."""
    return daemon.ready and all(client.get(f"/v1/targets/{n}").json()["lag"] == 0 for n in names)


def check_at_least_once_in_order(received: list[dict], expected: list[dict]) -> None:
    """De-duplicated by offset, ``received`` is ``expected``; per subscription, each line's first arrival comes
    in offset order (a resent line repeats an earlier one, never overtakes a later one)."""
    assert {d["offset"]: d for d in received} == {d["offset"]: d for d in expected}
    seen: set[int] = set()
    first: dict[str, list[int]] = defaultdict(list)
    for d in received:
        if d["offset"] not in seen:
            seen.add(d["offset"])
            first[d["sub"]].append(d["offset"])
    assert all(offsets == sorted(offsets) for offsets in first.values())


def test_every_delivery_reaches_each_target_by_its_selector_signed(tmp_path, receiver):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    daemon, client = open_daemon(tmp_path / "data")
    try:
        definitions = {
            "all": {"kind": "webhook", "url": receiver.url, "subscriptions": "*", "secret_file": str(secret)},
            "some": {"kind": "webhook", "url": receiver.url, "subscriptions": ["s1", "s2", "r3"], "batch": 3},
            "prefixed": {"kind": "webhook", "url": receiver.url, "subscriptions": {"prefix": "r"}},
        }
        for name, body in definitions.items():
            assert client.put(f"/v1/targets/{name}", json=body).status_code == 201
        assert client.put("/v1/targets/all", json=definitions["all"]).status_code == 200  # unchanged
        lines = random_workload(seed=31, n=500) + ranked_workload(seed=32, n=300)
        client.post("/v1/records", content="".join(line + "\n" for line in lines).encode())
        wait_until(lambda: settled(daemon, client, definitions))
        expected = [json.loads(line) for line in daemon.read_committed("deliveries", 0, 1_000_000)]
        assert expected
        check_at_least_once_in_order(receiver.lines("all"), expected)
        check_at_least_once_in_order(receiver.lines("some"), [d for d in expected if d["sub"] in ("s1", "s2", "r3")])
        check_at_least_once_in_order(receiver.lines("prefixed"), [d for d in expected if d["sub"].startswith("r")])
        assert receiver.bad_signatures == 0 and all(len(b["deliveries"]) <= 3 for b in receiver.bodies
                                                    if b["target"] == "some")  # fmt: skip
        listed = client.get("/v1/targets").json()["targets"]
        assert [t["target"]["name"] for t in listed] == ["all", "prefixed", "some"]
        assert all(t["state"] == "running" and t["cursor"] == len(expected) for t in listed)
        assert client.delete("/v1/targets/some").json() == {"deleted": "some"}
        assert client.get("/v1/targets/some").status_code == 404
        assert not (tmp_path / "data" / "targets" / "some.json").exists()
    finally:
        daemon.stop()


def test_a_failing_target_pauses_alone_and_after_a_restart_resumes_from_its_cursor(tmp_path, receiver, monkeypatch):
    monkeypatch.setattr(targets_module, "PAUSE_SECONDS", 0.3)
    monkeypatch.setattr(targets_module, "MAX_WAIT_SECONDS", 0.2)
    healthy = WebhookReceiver(SECRET)
    daemon, client = open_daemon(tmp_path / "data")
    try:
        client.put("/v1/targets/flaky", json={"kind": "webhook", "url": receiver.url, "batch": 20})
        client.put("/v1/targets/steady", json={"kind": "webhook", "url": healthy.url})
        receiver.failing.set()
        lines = random_workload(seed=41, n=600) + ranked_workload(seed=42, n=200)
        client.post("/v1/records", content="".join(line + "\n" for line in lines[:400]).encode())
        wait_until(lambda: settled(daemon, client, ["steady"]))  # the steady target is not held up
        wait_until(lambda: client.get("/v1/targets/flaky").json()["state"] == "paused")
        flaky = client.get("/v1/targets/flaky").json()
        assert flaky["lag"] > 0 and flaky["failed"] > 0 and flaky["last_error"].startswith("500")
        assert 'skpub_target_paused{target="flaky"} 1.0' in client.get("/metrics").text
        daemon.stop()  # while the target fails: its cursor is durable
        daemon, client = open_daemon(tmp_path / "data")
        client.post("/v1/records", content="".join(line + "\n" for line in lines[400:]).encode())
        receiver.failing.clear()
        wait_until(lambda: settled(daemon, client, ["flaky", "steady"]))
        expected = [json.loads(line) for line in daemon.read_committed("deliveries", 0, 1_000_000)]
        check_at_least_once_in_order(receiver.lines("flaky"), expected)
        check_at_least_once_in_order(healthy.lines("steady"), expected)
        assert client.get("/v1/targets/flaky").json()["state"] == "running"
        assert receiver.refused > 0
    finally:
        daemon.stop()
        healthy.close()


@pytest.mark.parametrize(
    ("name", "body", "why"),
    [
        ("bad name", {"kind": "webhook", "url": "http://x/"}, "target name"),
        ("t", {"kind": "mqtt", "url": "http://x/"}, "mqtt://"),
        ("t", {"kind": "mqtt", "url": "mqtt://x", "topic": "a/+/b"}, "wildcard"),
        ("t", {"kind": "nats", "url": "nats://x:4222", "subject": "a b.{sub}"}, "subject"),
        ("t", {"kind": "redis", "url": "redis://x", "topic": "t"}, "unknown field"),
        ("t", {"kind": "carrier-pigeon", "url": "http://x/"}, "kind must be"),
        ("t", {"kind": "webhook", "url": "ftp://x/"}, "url"),
        ("t", {"kind": "webhook", "url": "http://x/", "subscriptions": {"suffix": "a"}}, "subscriptions"),
        ("t", {"kind": "webhook", "url": "http://x/", "secret_file": "/nonexistent"}, "secret_file"),
        ("t", {"kind": "webhook", "url": "http://x/", "batch": 0}, "batch"),
        ("t", {"kind": "webhook", "url": "http://x/", "colour": "red"}, "unknown field"),
    ],
)
def test_a_target_that_cannot_be_used_is_refused_with_a_sentence(tmp_path, name, body, why):
    daemon = Daemon(tmp_path / "data", deployment(evaluators=2, batch_size=10))
    try:
        reply = TestClient(create_app(daemon, None)).put(f"/v1/targets/{name}", json=body)
        assert reply.status_code == 422
        assert reply.json()["reason"] == "bad_target" and why in reply.json()["detail"]
        assert not (tmp_path / "data" / "targets").exists()
    finally:
        daemon.stop()
