"""Delivery targets (SEMANTICS section 7): every delivery reaches each target at least once, in offset order per
subscription, through failures of the target and restarts of the daemon; a failing target pauses alone.

The webhook receiver is a real HTTP server on loopback (``http.server``), which can be told to fail.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict

import pytest
from fastapi.testclient import TestClient

from skpub.app import targets as targets_module
from skpub.app.api import create_app
from skpub.app.daemon import Daemon, Limits
from skpub.app.serve import load_targets
from skpub.kernel.errors import ConfigError
from skpub.kernel.oracle import replay
from tests.served import Served, WebhookReceiver
from tests.workloads import canonical, deployment, random_workload, ranked_workload, results_from_events

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
        signed = [b for b in receiver.bodies if b["target"] == "all"]
        assert signed and all(b["signed"] for b in signed)  # every body of the target with a secret is signed
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
        ("t", {"kind": "webhook", "url": "http://x/", "name": "u"}, "one target per request"),
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


@pytest.mark.integration
@pytest.mark.slow
def test_a_webhook_gets_every_delivery_across_kill_9_of_the_daemon_as_the_oracle_says(tmp_path):
    """A ``skpub serve`` process killed with SIGKILL while it pushes, then restarted on its data: the webhook's
    lines, de-duplicated by offset, are the daemon's delivery log, whose range matches are the oracle's and whose
    topk/knn events fold to the oracle's results."""
    receiver = WebhookReceiver()
    dep = deployment(evaluators=3, batch_size=40)
    config = tmp_path / "dep.json"
    config.write_text(json.dumps(dep.to_json()))
    lines = random_workload(seed=71, n=600) + ranked_workload(seed=72, n=300)
    served = Served(tmp_path / "data", config)
    port = served.port
    try:
        hook = {"kind": "webhook", "url": receiver.url, "batch": 7}
        assert served.http.put("/v1/targets/hook", json=hook).status_code == 201
        served.post(lines[:450])
        wait_until(lambda: len(receiver.lines("hook")) > 20)
    finally:
        served.proc.kill()  # kill -9 in the middle of pushing
        served.proc.wait(60)
    again = Served(tmp_path / "data", config, port=port)
    try:
        again.post(lines[450:])
        again.wait_ready()
        expected = again.read("deliveries")
        wait_until(lambda: {d["offset"] for d in receiver.lines("hook")} >= {d["offset"] for d in expected})
        got = receiver.lines("hook")
        check_at_least_once_in_order(got, expected)
    finally:
        again.proc.kill()
        again.proc.wait(60)
        receiver.close()
    check_against_oracle(got, lines, dep)


def check_against_oracle(got: list[dict], lines: list[str], dep) -> None:  # noqa: ANN001
    """De-duplicated by offset, ``got``'s range matches are the oracle's and its topk/knn events fold to the
    oracle's results for the stream ``lines``."""
    unique = [{k: v for k, v in d.items() if k != "offset"} for d in {d["offset"]: d for d in got}.values()]
    oracle = replay(lines, dep).deliveries
    assert canonical([d for d in unique if d["event"] == "match"]) == canonical(
        [d for d in oracle if d["event"] == "match"]
    )
    ranked = [d for d in unique if d["event"] != "match"]
    assert results_from_events(ranked) == results_from_events([d for d in oracle if d["event"] != "match"])


class Gone(Exception):
    pass


class FakeLog:
    """A committed delivery log in memory, whose head retention can remove."""

    def __init__(self, count: int) -> None:
        self.lines = [
            json.dumps({"offset": i, "sub": f"s{i % 3}", "event": "match"}).encode() for i in range(1, count + 1)
        ]
        self.earliest = 0

    def read(self, after: int, limit: int) -> list[bytes]:
        if after < self.earliest:
            raise Gone
        return self.lines[after : after + limit]


def test_a_target_counts_what_retention_took_and_survives_an_unreadable_secret(tmp_path, receiver, monkeypatch):
    monkeypatch.setattr(targets_module, "MAX_WAIT_SECONDS", 0.05)
    log = FakeLog(100)
    log.earliest = 30  # retention removed offsets 1..30 before the target read them
    events = []
    targets = targets_module.Targets(
        tmp_path / "targets", log.read, lambda: len(log.lines), lambda: log.earliest, Gone,
        lambda name, status, event: events.append(event),
    )  # fmt: skip
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    spec = targets_module.TargetSpec.from_json(
        "t", {"kind": "webhook", "url": receiver.url, "secret_file": str(secret)}
    )
    targets.put(spec, after=0)
    secret.unlink()  # the secret goes: sends fail, counted, the thread lives on
    targets.start()
    try:
        wait_until(lambda: targets.status("t")["failed"] >= 2)
        status = targets.status("t")
        assert "secret_file" in status["last_error"] and targets.targets["t"].thread.is_alive()
        assert status["behind_retention"] == 30 and "behind_retention" in events
        secret.write_bytes(SECRET)
        wait_until(lambda: targets.status("t")["lag"] == 0)
    finally:
        targets.stop()
    assert [d["offset"] for d in receiver.lines("t")] == list(range(31, 101))
    assert receiver.bad_signatures == 0


def test_two_redis_targets_may_not_write_one_stream_and_a_redefinition_keeps_place_and_counts(tmp_path, receiver):
    log = FakeLog(10)
    targets = targets_module.Targets(tmp_path / "targets", log.read, lambda: 10, lambda: 0, Gone)
    redis = {"kind": "redis", "url": "redis://127.0.0.1:1/0"}
    targets.put(targets_module.TargetSpec.from_json("a", {**redis, "subscriptions": {"prefix": "a"}}))
    with pytest.raises(targets_module.TargetError, match="writes that redis stream"):
        targets.put(targets_module.TargetSpec.from_json("b", {**redis, "subscriptions": {"prefix": "b"}}))
    targets.put(targets_module.TargetSpec.from_json("b", {**redis, "stream": "other"}))
    hook = targets_module.TargetSpec.from_json("h", {"kind": "webhook", "url": receiver.url})
    targets.put(hook, after=0)
    targets.start()
    try:
        wait_until(lambda: targets.status("h")["delivered"] == 10)
        assert not targets.put(hook)  # unchanged
        targets.put(targets_module.TargetSpec.from_json("h", {"kind": "webhook", "url": receiver.url, "batch": 2}))
        assert (targets.status("h")["cursor"], targets.status("h")["delivered"]) == (10, 10)
        assert targets.delete("h") and not (tmp_path / "targets" / "h.json").exists()
    finally:
        targets.stop()
    assert not (tmp_path / "targets" / "h.json").exists()  # no thread wrote it back after its stop


def test_nats_waves_send_a_subscriptions_line_only_after_its_earlier_one():
    from skpub.app.senders import _waves

    batch = [(1, "a", b"1"), (2, "b", b"2"), (3, "a", b"3"), (4, "a", b"4"), (5, "c", b"5"), (6, "b", b"6")]
    assert _waves(batch) == [
        [(1, "a", b"1"), (2, "b", b"2"), (5, "c", b"5")],
        [(3, "a", b"3"), (6, "b", b"6")],
        [(4, "a", b"4")],
    ]


def test_lag_seconds_is_the_age_of_the_first_line_after_the_cursor(tmp_path, monkeypatch):
    monkeypatch.setattr(targets_module, "COMMIT_TIMES", 4)
    committed = {"n": 5}
    targets = targets_module.Targets(tmp_path / "targets", FakeLog(0).read, lambda: committed["n"], lambda: 0, Gone)
    started = targets._commit_times[0][1]  # lines 1..5 were committed before this process: aged from its start
    for end, at in [(8, 100.0), (8, 150.0), (12, 200.0), (20, 300.0)]:  # commit times (monotonic seconds)
        committed["n"] = end
        targets.committed_at(end, started + at)
    now = started + 1000.0
    # ages are differences of monotonic readings: exact to a rounding of ``started + at`` (which flakes at == 900.0)
    assert targets.lag_seconds(20, now) == 0.0  # caught up
    assert targets.lag_seconds(12, now) == pytest.approx(700.0, abs=1e-6)  # line 13 came with the commit at 300
    assert targets.lag_seconds(11, now) == targets.lag_seconds(8, now) == pytest.approx(800.0, abs=1e-6)  # 9..12
    assert targets.lag_seconds(7, now) == pytest.approx(900.0, abs=1e-6)  # line 8 at 100 (the same end: no commit)
    assert targets.lag_seconds(0, now) == pytest.approx(1000.0, abs=1e-6)  # lines 1..5: aged from the start


def test_lag_seconds_of_a_target_paused_for_long_stays_within_the_tolerance_of_the_true_age(tmp_path, monkeypatch):
    """Commit times thinned again and again: for cursors paused at any point, the age reported after every commit
    is the true age of the first line after the cursor, or at most AGE_TOLERANCE of it less; it never plateaus."""
    monkeypatch.setattr(targets_module, "COMMIT_TIMES", 2000)
    committed = {"n": 0}
    targets = targets_module.Targets(tmp_path / "targets", FakeLog(0).read, lambda: committed["n"], lambda: 0, Gone)
    started = targets._commit_times[0][1]
    cursors = [0, 37, 1000, 4000]  # line c + 1 is committed at second c + 1 (one line per commit, one a second)
    for t in range(1, 6001):
        committed["n"] = t
        targets.committed_at(t, started + t)
        assert len(targets._commit_times) <= 2000
        for cursor in cursors:
            if cursor < t:
                true_age = t - (cursor + 1)
                reported = targets.lag_seconds(cursor, started + t)
                assert true_age * (1 - targets_module.AGE_TOLERANCE) - 1e-6 <= reported <= true_age + 1e-6


def test_a_targets_file_is_read_with_a_sentence_for_what_cannot_be_used(tmp_path):
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"hook": {"kind": "webhook", "url": "http://127.0.0.1:9/in"}}))
    assert [s.name for s in load_targets(path)] == ["hook"]
    for text, why in [("[]", "a JSON object"), ("{", "not JSON"), ('{"h": {"kind": "fax"}}', "target 'h': kind must")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(why)):
            load_targets(path)


@pytest.mark.integration
@pytest.mark.slow
def test_skpub_serve_defines_the_targets_of_its_file_at_start(tmp_path, receiver):
    config = tmp_path / "dep.json"
    config.write_text(json.dumps(deployment(evaluators=2, batch_size=20).to_json()))
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps({"hook": {"kind": "webhook", "url": receiver.url}}))
    served = Served(tmp_path / "data", config, extra=("--targets", str(targets)))
    try:
        assert [t["target"]["name"] for t in served.http.get("/v1/targets").json()["targets"]] == ["hook"]
        served.post(random_workload(seed=81, n=200, invalid=False))
        served.wait_ready()
        expected = served.read("deliveries")
        wait_until(lambda: len(receiver.lines("hook")) >= len(expected))
        check_at_least_once_in_order(receiver.lines("hook"), expected)
    finally:
        served.proc.terminate()
        served.proc.wait(60)
