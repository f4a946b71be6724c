"""The Python client and the CLI verbs, against a running daemon (``skpub serve`` over real HTTP).

The client's own logic (bodies, retries, refusals) is also checked in process
against httpx's mock transport, so the fast tier covers it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest

from skpub.client import FLUSH, Client, Refused, _bodies, live_lines
from tests.served import Served, free_port
from tests.workloads import deployment, random_workload

RANGE = {"kind": "range", "rect": [0, 0, 60, 60], "keywords": ["a"]}


def test_bodies_keep_every_line_in_order_within_the_size_and_a_long_line_goes_alone():
    lines = ["x" * 10, b"y" * 30, {"type": "object"}, "z" * 5 + "\n"]
    bodies = list(_bodies(lines, 25))
    assert b"".join(bodies) == b"xxxxxxxxxx\n" + b"y" * 30 + b'\n{"type": "object"}\nzzzzz\n'
    assert [len(b) for b in bodies] == [11, 31, 25]


def test_a_flush_among_the_lines_ends_the_body_being_filled():
    assert list(_bodies(["a", FLUSH, b"b", "c", FLUSH, FLUSH], 1 << 20)) == [b"a\n", b"b\nc\n"]


def test_live_lines_flush_a_line_that_waited_linger_whether_the_input_pauses_or_trickles():
    read, write = os.pipe()
    try:
        os.write(write, b"a\nb")
        lines = live_lines(read, 0.05)
        assert next(lines) == b"a"
        assert next(lines) is FLUSH  # nothing more came: a waited 0.05 s (select timed out), b has no end yet
        os.write(write, b"c\r\nd\n")
        assert next(lines) == b"bc\r"  # the terminator only: the \r is the caller's (SEMANTICS 1)
        os.close(write)
        assert [x for x in lines if x is not FLUSH] == [b"d"]
    finally:
        os.close(read)
    read, write = os.pipe()
    try:
        os.write(write, b"x\ny\n")
        os.close(write)
        # linger 0: lines that keep coming are flushed after each read, never held for a pause
        assert list(live_lines(read, 0.0)) == [b"x", b"y", FLUSH]
    finally:
        os.close(read)
    read, write = os.pipe()
    try:
        os.write(write, b"abcdefghij\n\nkl")
        os.close(write)
        # reads of 3 bytes: a line's pieces are joined, an empty line is a line, the end of input ends the last
        assert [x for x in live_lines(read, 60.0, read_bytes=3) if x is not FLUSH] == [b"abcdefghij", b"", b"kl"]
    finally:
        os.close(read)


def test_a_full_backlog_is_waited_out_and_a_refusal_carries_its_reason():
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if request.method == "POST" and len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "full"})
        if request.method == "POST":
            return httpx.Response(202, json={"accepted": 2, "first": 5, "last": 6})
        return httpx.Response(422, json={"detail": "k must be >= 1", "reason": "bad_k"})

    with Client("http://skpub", token="t", transport=httpx.MockTransport(answer)) as client:
        assert client.publish(["{}", "{}"]) == {"accepted": 2, "first": 5, "last": 6}
        assert len(calls) == 2 and calls[1].headers["authorization"] == "Bearer t"
        with pytest.raises(Refused) as refused:
            client.subscribe("a b/c", {"kind": "topk", "k": 0})
    assert (refused.value.status, refused.value.reason) == (422, "bad_k")
    assert calls[-1].url.raw_path == b"/v1/subscriptions/a%20b%2Fc"


@pytest.fixture
def served(tmp_path):
    config = tmp_path / "dep.json"
    config.write_text(json.dumps(deployment(evaluators=2, batch_size=50).to_json()))
    daemon = Served(tmp_path / "data", config)
    daemon.config = config
    yield daemon
    daemon.proc.kill()
    daemon.proc.wait(60)


@pytest.mark.integration
@pytest.mark.slow
def test_the_client_subscribes_publishes_lists_and_follows_a_running_daemon(served):
    with Client(served.url, token="t0ken") as client:
        assert client.subscribe("mine", RANGE)["accepted"] == 1
        assert client.subscribe("mine", {**RANGE, "keywords": ["A"]})["accepted"] == 0  # a retried request
        with pytest.raises(Refused) as refused:
            client.subscribe("s2", {**RANGE, "kind": "circle"})
        assert (refused.value.status, refused.value.reason) == (422, "unknown_kind")
        lines = random_workload(seed=3, n=400, invalid=False)
        assert client.publish(lines, body_bytes=2000)["accepted"] == len(lines)
        served.wait_ready()
        expected = served.read("deliveries")
        assert expected and client.get("mine")["subscription"]["id"] == "mine"
        assert [s["id"] for s in client.subscriptions()] == sorted(s["id"] for s in client.subscriptions())
        polled = list(client.follow(after=0, wait=0.2, idle_stop=True))
        assert polled == expected
        mine = list(client.follow(after=0, subscription="mine", wait=0.2, idle_stop=True))
        assert mine == [d for d in expected if d["sub"] == "mine"]
        streamed = []
        for line in client.follow(after=0, sse=True):
            streamed.append(line)
            if len(streamed) == len(expected):
                break
        assert streamed == expected
        with pytest.raises(Refused) as past:
            next(client.follow(after=len(expected) + 5))
        assert past.value.status == 416 and past.value.body["end"] == len(expected)
        taken = client.snapshot("snap")
        served.wait_ready()
        assert taken["id"] == "snap" and client.snapshot_lines("snap") is not None


@pytest.mark.integration
@pytest.mark.slow
def test_a_follower_resumes_across_kill_9_of_the_daemon_and_sees_every_offset_once(served, tmp_path):
    lines = random_workload(seed=11, n=600, invalid=False)
    port, cursor = served.port, tmp_path / "cursor"
    with Client(served.url, token="t0ken", retry_seconds=300) as client:
        client.publish(lines[:300])
        got: list[dict] = []
        total = {"n": None}

        def consume() -> None:
            while total["n"] is None or len(got) < total["n"]:  # idle: look again (more may come, or the total)
                got.extend(client.follow(cursor=cursor, wait=0.5, idle_stop=True))

        follower = threading.Thread(target=consume, daemon=True)
        follower.start()
        served.wait_ready()
        served.proc.kill()  # kill -9 while the follower long-polls
        served.proc.wait(60)
        again = Served(tmp_path / "data", served.config, port=port)
        try:
            again.post(lines[300:])
            again.wait_ready()
            total["n"] = len(again.read("deliveries"))
            follower.join(120)
            assert not follower.is_alive()
        finally:
            again.proc.kill()
            again.proc.wait(60)
    assert [d["offset"] for d in got] == list(range(1, total["n"] + 1))
    # a line counts as handled when the next one is asked for: an idle follow saved the last one too
    assert int(cursor.read_text()) == total["n"]


@pytest.mark.integration
@pytest.mark.slow
def test_the_cli_verbs_talk_to_a_running_daemon(served, tmp_path):
    env = {**os.environ, "SKPUB_TOKEN": "t0ken", "SKPUB_URL": served.url}

    def skpub(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skpub.app.cli", *args], env=env, input=stdin,
                              capture_output=True, timeout=120)  # fmt: skip

    assert skpub("subscribe", "mine", json.dumps(RANGE)).returncode == 0
    refused = skpub("subscribe", "mine", json.dumps({**RANGE, "rect": [0, 0, 1, 1]}))
    assert refused.returncode == 1 and b"409" in refused.stderr and b"duplicate_id" in refused.stderr
    records = tmp_path / "records.jsonl"
    records.write_text("".join(line + "\n" for line in random_workload(seed=5, n=200, invalid=False)))
    published = skpub("publish", str(records))
    assert published.returncode == 0 and json.loads(published.stdout)["accepted"] == 200
    assert json.loads(skpub("publish", "-", stdin=b'{"type": "object"}\n').stdout)["accepted"] == 1
    served.wait_ready()
    expected = served.read("deliveries")
    followed = skpub("follow", "--count", str(len(expected)))
    assert [json.loads(line) for line in followed.stdout.splitlines()] == expected
    cursor = str(tmp_path / "cursor")
    first = skpub("follow", "--count", "2", "--cursor", cursor)
    then = skpub("follow", "--count", "1", "--cursor", cursor)  # goes on after the last line printed
    assert [json.loads(line) for line in (first.stdout + then.stdout).splitlines()] == expected[:3]
    listed = [json.loads(line)["id"] for line in skpub("subscriptions").stdout.splitlines()]
    assert "mine" in listed and listed == sorted(listed)
    assert skpub("unsubscribe", "mine").returncode == 0
    gone = skpub("unsubscribe", "nobody")
    assert gone.returncode == 1 and b"unknown_id" in gone.stderr
    hook = {"kind": "webhook", "url": f"http://127.0.0.1:{free_port()}/in", "subscriptions": {"prefix": "s"}}
    defined = skpub("targets", "hook", "--define", json.dumps(hook))
    assert defined.returncode == 0 and json.loads(defined.stdout)["target"]["subscriptions"] == {"prefix": "s"}
    (tmp_path / "hook.json").write_text(json.dumps({**hook, "batch": 7}))
    redefined = skpub("targets", "hook", "--define", f"@{tmp_path / 'hook.json'}")
    assert json.loads(redefined.stdout)["target"]["batch"] == 7
    assert [t["target"]["name"] for t in map(json.loads, skpub("targets").stdout.splitlines())] == ["hook"]
    assert json.loads(skpub("targets", "hook").stdout)["target"]["name"] == "hook"
    bad = skpub("targets", "other", "--define", json.dumps({**hook, "kind": "kafka"}))
    assert bad.returncode == 1 and b"422" in bad.stderr and b"bad_target" in bad.stderr
    assert json.loads(skpub("targets", "hook", "--delete").stdout) == {"deleted": "hook"}
    for missing in (skpub("targets", "hook"), skpub("targets", "hook", "--delete")):
        assert missing.returncode == 1 and b"404" in missing.stderr
    assert skpub("targets").stdout == b""
    wrong = skpub("subscriptions", "--url", f"http://127.0.0.1:{free_port()}", "--retry-seconds", "1")
    assert wrong.returncode == 2 and b"no answer from the daemon" in wrong.stderr


def test_a_filtered_follow_goes_past_windows_without_its_lines_and_a_cursor_keeps_its_place(tmp_path):
    """A subscription's lines far apart: each poll scans a bounded window and returns ``next``; the client goes
    on from there (it used to ask for the same window forever)."""
    log = [{"offset": i, "sub": "mine" if i in (3, 40_000) else "other", "event": "match"} for i in range(1, 40_001)]
    asked = []

    def answer(request: httpx.Request) -> httpx.Response:
        after = int(request.url.params["after"])
        asked.append(after)
        window = log[after : after + 16_000]
        lines = [d for d in window if d["sub"] == request.url.params.get("subscription", d["sub"])]
        return httpx.Response(200, json={"deliveries": lines, "next": after + len(window)})

    cursor = tmp_path / "cursor"
    with Client("http://skpub", transport=httpx.MockTransport(answer)) as client:
        got = list(client.follow(subscription="mine", cursor=cursor, idle_stop=True))
    assert [d["offset"] for d in got] == [3, 40_000] and asked == [0, 16_000, 32_000, 40_000]
    assert int(cursor.read_text()) == 40_000
    cursor.write_text("garbage")
    with pytest.raises(ValueError, match="does not hold an offset"), Client("http://skpub") as client:
        next(client.follow(cursor=cursor))


def test_a_request_that_appends_is_not_sent_again_once_it_reached_the_daemon():
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        raise httpx.ReadTimeout("the reply was lost", request=request)

    with Client("http://skpub", retry_seconds=5, transport=httpx.MockTransport(answer)) as client:
        for call in (lambda: client.publish(["{}"]), lambda: client.unsubscribe("a"), lambda: client.snapshot()):
            with pytest.raises(httpx.ReadTimeout):
                call()
    assert sent == ["POST", "DELETE", "POST"]  # once each
