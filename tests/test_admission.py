"""The subscription endpoints say no at once (SEMANTICS section 7), and what they accept the data plane accepts.

A refused request appends nothing (no record, no dead letter); a subscribe
identical to the live one appends nothing either; an accepted one is never
a dead letter. The checks hold against the committed state, the lines
acknowledged but not yet processed (posted through any route, escaped
spellings included), and across a restart.
"""

from __future__ import annotations

import io
import json
import random

import orjson
import pytest
from fastapi.testclient import TestClient

from skpub.app.api import create_app
from skpub.app.commits import LOGS, Base, Commit
from skpub.app.daemon import Daemon, Limits
from skpub.app.serve import json_log
from skpub.kernel.errors import CheckpointError
from tests.workloads import deployment

AUTH = {"Authorization": "Bearer s3cret"}
RANGE = {"kind": "range", "rect": [0, 0, 10, 10], "keywords": ["Sushi", "ramen"]}


def open_daemon(data, start=False):  # noqa: ANN001, ANN201
    daemon = Daemon(data, deployment(evaluators=2, batch_size=8), Limits(trigger=0.01, max_backlog=10_000))
    if start:
        daemon.start()
    return daemon


def settle(daemon):  # noqa: ANN001
    """Wait until the data plane has processed every acknowledged line (it is polled, not timed)."""
    while not daemon.ready:
        assert daemon.failure is None
        daemon.stopping.wait(0.01)


def dead_letters(daemon):  # noqa: ANN001, ANN201
    return [orjson.loads(line) for line in daemon.read_committed("dead_letters", 0, 10_000)]


@pytest.fixture
def idle(tmp_path):
    """A daemon whose data plane does not run: every check is against acknowledged lines only."""
    daemon = open_daemon(tmp_path / "data")
    with TestClient(create_app(daemon, token="s3cret")) as client:
        client.daemon = daemon
        yield client
    daemon.stop()


def test_an_invalid_definition_is_refused_with_its_semantics_reason_and_appends_nothing(idle):
    cases = [
        ({"kind": "circle", "rect": [0, 0, 1, 1], "keywords": ["a"]}, 422, "unknown_kind"),
        ({"kind": "topk", "point": [1, 1], "k": 0, "alpha": 0.5, "keywords": ["a"]}, 422, "bad_k"),
        ({"kind": "range", "rect": [5, 0, 1, 1], "keywords": ["a"]}, 422, "bad_rect"),
        ({"kind": "range", "rect": [0, 0, 1, 1], "keywords": []}, 422, "empty_keywords"),
        ({"kind": "range", "rect": [0, 0, 1, 1], "expr": "a AND (b"}, 422, "bad_expr"),
        ({"kind": "knn", "point": [500, 1], "k": 1, "keywords": ["a"]}, 422, "out_of_space"),
        ({"kind": "range", "rect": [0, 0, 1, 1]}, 422, "missing_field"),
        ({**RANGE, "type": "object"}, 422, "wrong_field"),
        ({**RANGE, "id": "other"}, 422, "wrong_field"),
    ]
    for fields, status, reason in cases:
        reply = idle.put("/v1/subscriptions/s1", json=fields, headers=AUTH)
        assert (reply.status_code, reply.json()["reason"]) == (status, reason), fields
        assert reply.json()["detail"]
    for body in (
        b"{",
        b"[1]",
        b"\xff",
        b'{"kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"], "keywords": ["b"]}',
    ):
        reply = idle.put("/v1/subscriptions/s1", content=body, headers=AUTH)
        assert (reply.status_code, reply.json()["reason"]) == (400, "malformed_json"), body
    for body in (b'{"kind": "knn", "point": [1e400, 1], "k": 1, "keywords": ["a"]}', b'{"kind": "knn", "k": NaN}'):
        reply = idle.put("/v1/subscriptions/s1", content=body, headers=AUTH)
        assert (reply.status_code, reply.json()["reason"]) == (422, "non_finite"), body
    huge = b'{"kind": "topk", "point": [1, 1], "alpha": 0.5, "keywords": ["a"], "k": 123456789012345678901234567890}'
    reply = idle.put("/v1/subscriptions/s1", content=huge, headers=AUTH)
    assert reply.status_code in (202, 422), reply.text  # whatever the rules say, never a server error
    assert idle.daemon.ingest.count == 0


def test_ids_are_checked_against_every_acknowledged_line(idle):
    put = idle.put
    first = put("/v1/subscriptions/s1", json=RANGE, headers=AUTH)
    assert first.status_code == 202 and first.json() == {"accepted": 1, "first": 0, "last": 0}
    same = {**RANGE, "keywords": ["RAMEN", "sushi"]}  # the same subscription once normalized
    again = put("/v1/subscriptions/s1", json=same, headers=AUTH)
    assert again.status_code == 200 and again.json() == {"accepted": 0, "first": None, "last": None}
    expr = {"kind": "range", "rect": [0, 0, 1, 1], "expr": "a OR (b AND c)"}
    assert put("/v1/subscriptions/e1", json=expr, headers=AUTH).status_code == 202
    swapped = put("/v1/subscriptions/e1", json={**expr, "expr": "c AND B OR a"}, headers=AUTH)
    assert swapped.status_code == 200
    other = put("/v1/subscriptions/s1", json={**RANGE, "rect": [0, 0, 5, 5]}, headers=AUTH)
    assert (other.status_code, other.json()["reason"]) == (409, "duplicate_id")
    assert idle.delete("/v1/subscriptions/nobody", headers=AUTH).json()["reason"] == "unknown_id"
    assert idle.delete("/v1/subscriptions/nobody", headers=AUTH).status_code == 404
    assert idle.delete("/v1/subscriptions/s1", headers=AUTH).status_code == 202
    assert idle.delete("/v1/subscriptions/s1", headers=AUTH).status_code == 404
    reused = put("/v1/subscriptions/s1", json=RANGE, headers=AUTH)
    assert (reused.status_code, reused.json()["reason"]) == (409, "duplicate_id")
    # lines posted as records count too, however their type is spelled
    posted = [
        json.dumps({"type": "subscribe", "id": "p1", **RANGE}),
        '{"type": "subscrib\\u0065", "id": "p2", "kind": "range", "rect": [0, 0, 1, 1], "keywords": ["a"]}',
        json.dumps({"type": "subscribe", "id": "p3", "kind": "circle"}),  # a dead letter: p3 stays unknown
        json.dumps({"type": "unsubscribe", "id": "p1"}),
    ]
    assert idle.post("/v1/records", content="\n".join(posted).encode(), headers=AUTH).status_code == 202
    for sid in ("p1", "p2"):
        assert put(f"/v1/subscriptions/{sid}", json={**RANGE, "rect": [1, 1, 2, 2]}, headers=AUTH).status_code == 409
    assert put("/v1/subscriptions/p3", json=RANGE, headers=AUTH).status_code == 202
    assert idle.delete("/v1/subscriptions/p2", headers=AUTH).status_code == 202
    assert idle.daemon.ingest.count == 3 + 4 + 2


def test_the_data_plane_accepts_every_request_the_api_accepts_across_a_restart(tmp_path):
    """Random requests against a running daemon, restarted halfway: every acknowledged subscription request
    becomes an accepted record (no dead letter from the API), every refused one appends nothing, and the live
    subscriptions are what the acknowledged requests add up to."""
    rng = random.Random(7)
    data = tmp_path / "data"
    ids = [f"s{i}" for i in range(12)]
    live: dict[str, dict] = {}
    used: set[str] = set()
    for half in range(2):
        daemon = open_daemon(data, start=True)
        client = TestClient(create_app(daemon, None))
        for step in range(150):
            sid = rng.choice(ids)
            if rng.random() < 0.6:
                fields = {**RANGE, "rect": [0, 0, rng.randint(1, 3), 5]}
                if rng.random() < 0.1:
                    fields["kind"] = "circle"
                reply = client.put(f"/v1/subscriptions/{sid}", json=fields)
                if fields["kind"] == "circle":
                    expected = 422
                elif sid in live:
                    expected = 200 if live[sid] == fields else 409
                else:
                    expected = 409 if sid in used else 202
                assert reply.status_code == expected, (half, step, sid, reply.json())
                if expected == 202:
                    live[sid] = fields
                    used.add(sid)
            else:
                reply = client.delete(f"/v1/subscriptions/{sid}")
                assert reply.status_code == (202 if sid in live else 404), (half, step, sid)
                live.pop(sid, None)
            if step % 40 == 0:
                settle(daemon)  # some checks against the committed state, some against the backlog
        settle(daemon)
        daemon.stop()
    daemon = open_daemon(data)
    assert dead_letters(daemon) == []
    listed = TestClient(create_app(daemon, None)).get("/v1/subscriptions", params={"limit": 100}).json()
    assert [s["id"] for s in listed["subscriptions"]] == sorted(live) and listed["next"] is None
    daemon.stop()


def test_subscriptions_are_listed_in_id_order_by_page_and_by_kind(tmp_path):
    daemon = open_daemon(tmp_path / "data", start=True)
    client = TestClient(create_app(daemon, None))
    for i in range(7):
        client.put(f"/v1/subscriptions/r{i}", json=RANGE)
        client.put(f"/v1/subscriptions/k{i}", json={"kind": "knn", "point": [1, 1], "k": 2, "keywords": ["a"]})
    settle(daemon)
    seen, after = [], None
    while True:
        page = client.get("/v1/subscriptions", params={"limit": 3, **({"after": after} if after else {})}).json()
        assert len(page["subscriptions"]) <= 3
        seen += [s["id"] for s in page["subscriptions"]]
        after = page["next"]
        if after is None:
            break
    assert seen == sorted([f"r{i}" for i in range(7)] + [f"k{i}" for i in range(7)])
    knn = client.get("/v1/subscriptions", params={"kind": "knn", "limit": 100}).json()["subscriptions"]
    assert [s["id"] for s in knn] == [f"k{i}" for i in range(7)] and {s["kind"] for s in knn} == {"knn"}
    assert client.get("/v1/subscriptions", params={"kind": "circle"}).status_code == 422
    daemon.stop()


def test_a_read_past_the_end_is_416_with_the_end_and_tokens_missing_or_wrong_are_told_apart(idle):
    for route in ("/v1/deliveries", "/v1/dead_letters", "/v1/snapshots", "/v1/deliveries/stream"):
        reply = idle.get(route, params={"after": 999_999}, headers=AUTH)
        assert reply.status_code == 416 and reply.json()["end"] == 0, route
        assert idle.get(route.replace("/stream", ""), params={"after": 0}, headers=AUTH).status_code == 200
    missing = idle.get("/v1/deliveries")
    wrong = idle.get("/v1/deliveries", headers={"Authorization": "Bearer nope"})
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["detail"] != wrong.json()["detail"]
    assert "invalid_token" in wrong.headers["www-authenticate"]


def test_a_commit_base_keeps_the_retired_ids_and_an_earlier_skpubs_base_reads_with_none():
    base = Base(Commit(4, 10, dict.fromkeys(LOGS, 0)))
    base.definitions["b"] = b'{"type":"subscribe","id":"b"}'
    base.retired |= {"a", "c"}
    again = Base.from_lines(iter(list(base.lines())))
    assert (dict(again.definitions), again.retired) == (dict(base.definitions), {"a", "c"})
    older = [line.replace(b'"skpub_commit_base":2', b'"skpub_commit_base":1') for line in base.lines()]
    assert Base.from_lines(iter([line for line in older if b'"retired"' not in line])).retired == set()
    with pytest.raises(CheckpointError):
        Base.from_lines(iter([older[0].replace(b":1", b":3", 1)]))


def test_the_document_lists_every_refusal_and_the_token_and_docs_are_served(idle):
    document = idle.get("/v1/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    put = document["paths"]["/v1/subscriptions/{sid}"]["put"]
    assert {"200", "202", "400", "401", "409", "413", "422", "429", "503"} <= set(put["responses"])
    assert put["requestBody"]["content"]["application/json"]["schema"]["discriminator"]["propertyName"] == "kind"
    assert {"410", "416"} <= set(document["paths"]["/v1/deliveries"]["get"]["responses"])
    assert "404" in document["paths"]["/v1/subscriptions/{sid}"]["delete"]["responses"]
    assert idle.get("/docs").status_code == 200
    assert idle.get("/v1/deliveries", params={"wait": "nan"}, headers=AUTH).status_code == 422


def test_the_daemon_logs_a_json_line_per_batch_and_per_refused_request(tmp_path):
    stream = io.StringIO()
    daemon = open_daemon(tmp_path / "data", start=True)
    with json_log(stream):
        client = TestClient(create_app(daemon, None))
        client.put("/v1/subscriptions/s1", json=RANGE)
        client.put("/v1/subscriptions/s1", json={**RANGE, "rect": [0, 0, 1, 1]})
        client.delete("/v1/subscriptions/nobody")
        settle(daemon)
        daemon.stop()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    refused = [(e["status"], e["reason"], e["route"]) for e in lines if e["event"] == "refused"]
    assert refused == [(409, "duplicate_id", "/v1/subscriptions/{sid}"), (404, "unknown_id", "/v1/subscriptions/{sid}")]
    batches = [e for e in lines if e["event"] == "batch"]
    assert batches and batches[-1]["processed"] == 1 and sum(e["records"] for e in batches) == 1
    assert all(e["ts"].endswith("+00:00") and e["level"] in ("info", "warning") for e in lines)


def test_the_pending_overlay_keeps_only_what_is_not_processed_yet(tmp_path):
    daemon = open_daemon(tmp_path / "data")
    client = TestClient(create_app(daemon, None))
    for i in range(300):
        assert client.put(f"/v1/subscriptions/q{i}", json=RANGE).status_code == 202
    assert len(daemon.admission) == 300
    daemon.start()
    settle(daemon)
    assert len(daemon.admission) == 0  # processed: the committed state answers for them
    assert client.put("/v1/subscriptions/q7", json={**RANGE, "rect": [0, 0, 1, 1]}).status_code == 409
    daemon.stop()
