"""The oracle's topk and knn semantics (SEMANTICS sections 3.2, 3.3, 4, 5) on hand-worked streams.

Each expected value below is worked out by hand from the contract, not by
the oracle's own code: events per record, refills when a result object
leaves the window, late and expiring objects, the three windows, ties, the
tf-idf score and snapshots.
"""

from __future__ import annotations

import json
import math

import pytest

from skpub.kernel.config import Window
from skpub.kernel.oracle import replay
from tests.workloads import deployment


def obj(oid, x, y, terms, **extra) -> str:
    return json.dumps({"type": "object", "id": oid, "x": x, "y": y, "terms": terms, **extra})


def knn(sid, x, y, keywords, k, **extra) -> str:
    return json.dumps({"type": "subscribe", "id": sid, "kind": "knn", "point": [x, y], "keywords": keywords, "k": k,
                       **extra})  # fmt: skip


def events(result) -> list[tuple]:
    return [(d["sub"], d["event"], d["obj"], d.get("dist", d.get("score"))) for d in result.deliveries]


def run(lines, window: Window | None = None):
    return replay(lines, deployment().replace(window=window or Window()))


def test_knn_without_window_sees_only_later_objects_and_keeps_the_k_nearest():
    lines = [
        obj("o0", 1, 0, ["a"]),
        knn("s", 0, 0, ["a"], 2),
        obj("o1", 10, 0, ["a"]),
        obj("o2", 5, 0, ["a", "z"]),
        obj("o3", 1, 0, ["b"]),
        obj("o4", 3, 0, ["a"]),
        json.dumps({"type": "snapshot", "id": "p"}),
    ]
    result = run(lines)
    assert events(result) == [
        ("s", "enter", "o1", 10.0),
        ("s", "enter", "o2", 5.0),
        ("s", "exit", "o1", 10.0),
        ("s", "enter", "o4", 3.0),
    ]
    assert result.snapshots == [{"snapshot": "p", "sub": "s", "results": [["o4", 3.0], ["o2", 5.0]]}]


def test_a_count_window_refills_from_what_is_left_and_never_from_older_objects():
    lines = [
        knn("s", 0, 0, ["a"], 1),
        obj("o1", 1, 0, ["a"]),
        obj("o2", 5, 0, ["a"]),
        obj("o3", 9, 0, ["b"]),  # o1 leaves the window of 2: o2 refills
        obj("o4", 9, 9, ["b"]),  # o2 leaves: nothing with "a" is left
    ]
    assert events(run(lines, Window("count", 2))) == [
        ("s", "enter", "o1", 1.0),
        ("s", "exit", "o1", 1.0),
        ("s", "enter", "o2", 5.0),
        ("s", "exit", "o2", 5.0),
    ]


def test_seconds_window_late_objects_missing_ts_and_expiry():
    lines = [
        knn("s", 0, 0, ["a"], 1),
        obj("o1", 3, 0, ["a"], ts=0.0),
        obj("o2", 50, 50, ["b"], ts=20.0),  # watermark 20: o1 (ts 0) is out of the 10 s window
        obj("o3", 1, 0, ["a"], ts=5.0),  # late: already outside when it arrives, never enters
        obj("o4", 6, 0, ["a"]),  # no ts: the watermark's, 20
        obj("o5", 2, 0, ["a"], ts=21.0, expires_at=22.0),
        obj("o6", 50, 50, ["b"], ts=22.0),  # watermark reaches o5's expires_at: o4 comes back
    ]
    assert events(run(lines, Window("seconds", 10))) == [
        ("s", "enter", "o1", 3.0),
        ("s", "exit", "o1", 3.0),
        ("s", "enter", "o4", 6.0),
        ("s", "exit", "o4", 6.0),
        ("s", "enter", "o5", 2.0),
        ("s", "exit", "o5", 2.0),
        ("s", "enter", "o4", 6.0),
    ]


def test_knn_match_all_and_from_registration():
    lines = [
        obj("o1", 1, 0, ["a", "b"]),
        knn("all", 0, 0, ["a", "b"], 3, match="all"),
        knn("reg", 0, 0, ["a"], 3, **{"from": "registration"}),
        obj("o2", 2, 0, ["a"]),
        obj("o3", 3, 0, ["b", "a", "c"]),
    ]
    got = events(run(lines, Window("count", 10)))
    assert [e for e in got if e[0] == "all"] == [("all", "enter", "o1", 1.0), ("all", "enter", "o3", 3.0)]
    assert [e for e in got if e[0] == "reg"] == [("reg", "enter", "o2", 2.0), ("reg", "enter", "o3", 3.0)]


def test_ties_within_the_tolerance_go_to_the_newer_ts_then_the_later_position():
    lines = [
        knn("s", 0, 0, ["a"], 2),
        obj("old", 0, 5, ["a"], ts=2.0),
        obj("new", 5, 0, ["a"], ts=1.0),
        obj("near", 3, 4 + 1e-12, ["a"], ts=3.0),  # dist 5 + ~1e-12: a tie, and the newest ts
    ]
    result = run(lines + [json.dumps({"type": "snapshot", "id": "p"})])
    assert [oid for oid, _ in result.snapshots[0]["results"]] == ["near", "old"]


def test_topk_scores_by_proximity_and_tf_idf_cosine(tmp_path):
    vocabulary = tmp_path / "vocabulary.json"
    vocabulary.write_text(json.dumps({"N": 100, "df": {"a": 10, "b": 50}}))
    sub = {"type": "subscribe", "id": "t", "kind": "topk", "point": [0, 0], "k": 1, "alpha": 0.25,
           "weights": {"a": 2.0, "b": 1.0}}  # fmt: skip
    lines = [json.dumps(sub), obj("o", 3, 4, ["a", "a", "c"]), obj("p", 3, 4, ["zz"])]
    result = replay(lines, deployment().replace(vocabulary=str(vocabulary)))
    idf_a, idf_b, idf_c = math.log(10), math.log(2), math.log(100)
    w_s = (2 * idf_a, 1 * idf_b)
    w_o = (2 * idf_a, 1 * idf_c)
    cosine = (w_s[0] * w_o[0]) / (math.hypot(*w_s) * math.hypot(*w_o))
    score = 0.25 * (1 - 5 / math.hypot(100, 100)) + 0.75 * cosine
    assert len(result.deliveries) == 1
    assert result.deliveries[0]["obj"] == "o" and result.deliveries[0]["score"] == pytest.approx(score, abs=1e-12)


def test_snapshots_list_every_active_ranked_subscription_and_unsubscribe_emits_nothing():
    lines = [
        knn("s1", 0, 0, ["a"], 1),
        knn("s2", 0, 0, ["q"], 1),
        json.dumps({"type": "subscribe", "id": "r", "kind": "range", "rect": [0, 0, 9, 9], "keywords": ["a"]}),
        obj("o1", 1, 1, ["a"]),
        json.dumps({"type": "unsubscribe", "id": "s1"}),
        json.dumps({"type": "snapshot", "id": "p"}),
    ]
    result = run(lines)
    assert result.snapshots == [{"snapshot": "p", "sub": "s2", "results": []}]
    assert [d["event"] for d in result.deliveries] == ["match", "enter"]


def test_a_tie_chain_wider_than_the_tolerance_is_one_group():
    lines = [
        knn("s", 0, 0, ["a"], 1),
        obj("a", 5, 0, ["a"], ts=1.0),
        obj("c", 5 + 1.6e-9, 0, ["a"], ts=2.0),  # 1.6e-9 from a: alone, a stays first
        json.dumps({"type": "snapshot", "id": "p1"}),
        obj("b", 5 + 0.8e-9, 0, ["a"], ts=3.0),  # within 1e-9 of both: one group a, b, c ordered by ts
        json.dumps({"type": "snapshot", "id": "p2"}),
    ]
    snapshots = run(lines).snapshots
    assert [s["results"][0][0] for s in snapshots] == ["a", "b"]


def test_a_rejected_object_takes_no_window_slot_and_moves_no_watermark():
    lines = [
        knn("s", 0, 0, ["a"], 1),
        obj("o1", 1, 0, ["a"], ts=1.0),
        obj("o1", 50, 50, ["b"], ts=99.0),  # duplicate id: rejected
        obj("o2", 50, 50, ["b"], ts=2.0),
    ]
    result = run(lines, Window("seconds", 5))
    assert [d["reason"] for d in result.dead_letters] == ["duplicate_id"]
    assert events(result) == [("s", "enter", "o1", 1.0)]
    counted = run(lines, Window("count", 2))
    assert events(counted) == [("s", "enter", "o1", 1.0)]


def test_config_refuses_windows_and_spaces_the_semantics_cannot_hold(tmp_path):
    from skpub.kernel.config import Deployment
    from skpub.kernel.errors import ConfigError
    from skpub.kernel.geometry import Rect
    from skpub.kernel.text import Vocabulary

    with pytest.raises(ConfigError, match="whole number"):
        Window("count", 2.5)
    with pytest.raises(ConfigError, match="MaxDist"):
        Deployment(space=Rect(-1e308, -1, 1e308, 1))
    for n in (0, -5, 10**400, "100", 1.5):
        path = tmp_path / "vocabulary.json"
        path.write_text(json.dumps({"N": n, "df": {}}) if n != 10**400 else '{"N": 1' + "0" * 400 + ', "df": {}}')
        with pytest.raises(ConfigError, match="'N'"):
            Vocabulary.load(path)
