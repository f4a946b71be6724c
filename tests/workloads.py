"""Seeded random workloads for differential tests.

Coordinates and rectangle corners are drawn from a lattice that includes
every fine-cell border of the test grid, so points and rectangles sit on cell
and partition borders often; terms come from a tiny vocabulary so matches are
frequent; every dead-letter reason of SEMANTICS section 1 appears.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa

from skpub.evaluators.gi2 import ObjectBatch
from skpub.kernel.config import BalancerConfig, Deployment, Window
from skpub.kernel.geometry import Rect

SPACE = Rect(0.0, 0.0, 100.0, 100.0)
TERMS = ["sushi", "ramen", "jazz", "Café", "bar", "CAFÉ", "noodle"]

INVALID_LINES = [
    ("not json at all", "malformed_json"),
    ("[1, 2, 3]", "malformed_json"),
    ('{"id": "x"}', "missing_field"),
    ('{"type": "tweet", "id": "x"}', "unknown_type"),
    ('{"type": "object", "x": 1, "y": 1, "terms": ["a"]}', "missing_field"),
    ('{"type": "object", "id": "bad1", "x": "1", "y": 1, "terms": ["a"]}', "wrong_field"),
    ('{"type": "object", "id": "bad2", "x": 1, "y": 1, "terms": "a"}', "wrong_field"),
    ('{"type": "object", "id": "bad3", "x": NaN, "y": 1, "terms": ["a"]}', "non_finite"),
    ('{"type": "object", "id": "bad4", "x": 1, "y": Infinity, "text": "a"}', "non_finite"),
    ('{"type": "object", "id": "bad5", "x": 100.5, "y": 1, "text": "a"}', "out_of_space"),
    ('{"type": "object", "id": "bad6", "x": 1, "y": 1}', "missing_field"),
    ('{"type": "subscribe", "id": "bs1", "kind": "range", "rect": [5, 5, 1, 9], "keywords": ["a"]}', "bad_rect"),
    ('{"type": "subscribe", "id": "bs2", "kind": "polygon", "rect": [0, 0, 1, 1], "keywords": ["a"]}', "unknown_kind"),
    ('{"type": "subscribe", "id": "bs3", "kind": "range", "rect": [0, 0, 1, 1], "keywords": []}', "empty_keywords"),
    ('{"type": "subscribe", "id": "bs4", "kind": "range", "rect": [0, 0, 1, 1], "expr": ""}', "empty_keywords"),
    ('{"type": "subscribe", "id": "bs5", "kind": "range", "rect": [0, 0, 1, 1], "expr": "a b"}', "bad_expr"),
    ('{"type": "subscribe", "id": "bs6", "kind": "range", "rect": [0, 0, 1, 1], "expr": "(a OR"}', "bad_expr"),
    ('{"type": "subscribe", "id": "bs7", "kind": "range", "rect": [0, 0, 1], "keywords": ["a"]}', "wrong_field"),
    ('{"type": "subscribe", "id": "bs8", "kind": "knn", "point": [1, 1], "keywords": ["a"], "k": 0}', "bad_k"),
    ('{"type": "subscribe", "id": "bs9", "kind": "topk", "point": [1, 1], "keywords": ["a"], "k": 2}', "bad_alpha"),
    (
        '{"type": "subscribe", "id": "bs10", "kind": "topk", "point": [1, 1], "keywords": ["a"], "k": 2, "alpha": 1.5}',
        "bad_alpha",
    ),
    (
        '{"type": "subscribe", "id": "bs11", "kind": "knn", "point": [101, 1], "keywords": ["a"], "k": 2}',
        "out_of_space",
    ),
    (
        '{"type": "subscribe", "id": "bs12", "kind": "knn", "point": [1, 1], "keywords": ["a"], "k": 2, "match": 1}',
        "wrong_field",
    ),
    ('{"type": "unsubscribe", "id": "never-subscribed"}', "unknown_id"),
    ('{"type": "snapshot"}', "missing_field"),
]


def deployment(evaluators: int = 4, router: str = "agrid", batch_size: int = 50, grid_size: int = 20) -> Deployment:
    """A small deployment over :data:`SPACE` whose cells are 5 x 5 units."""
    return Deployment(
        space=SPACE, evaluators=evaluators, router=router, batch_size=batch_size, grid_size=grid_size,
        index_block=2, sample_size=200,
    )  # fmt: skip


def _coordinate(rng: np.random.Generator) -> float:
    if rng.random() < 0.5:
        return float(rng.integers(0, 21) * 5.0)
    return float(np.round(rng.uniform(0, 100), 2))


def _expression(rng: np.random.Generator) -> dict:
    k = int(rng.integers(1, 4))
    words = [TERMS[i] for i in rng.choice(len(TERMS), size=k, replace=False)]
    form = rng.random()
    if form < 0.4 or k == 1:
        return {"keywords": words}
    if k == 2:
        return {"expr": f"{words[0]} or {words[1]}" if form < 0.7 else f"{words[0]} AND {words[1]}"}
    return {
        "expr": f"({words[0]} OR {words[1]}) and {words[2]}"
        if form < 0.7
        else f"{words[0]} OR {words[1]} AND {words[2]}"
    }


def random_workload(seed: int, n: int = 600, invalid: bool = True) -> list[str]:
    """Return ``n`` valid-or-invalid JSON lines: objects, range subscriptions, unsubscribes, duplicates."""
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    active: list[str] = []
    objects = subs = 0
    for _ in range(n):
        u = rng.random()
        if u < 0.25:
            x0, x1 = sorted((_coordinate(rng), _coordinate(rng)))
            y0, y1 = sorted((_coordinate(rng), _coordinate(rng)))
            if rng.random() < 0.1:
                x0, x1 = x0 - 50, x1 + 30
            sid = f"s{subs}"
            subs += 1
            lines.append(
                json.dumps(
                    {"type": "subscribe", "id": sid, "kind": "range", "rect": [x0, y0, x1, y1], **_expression(rng)}
                )
            )
            active.append(sid)
        elif u < 0.32 and active:
            lines.append(json.dumps({"type": "unsubscribe", "id": active.pop(int(rng.integers(len(active))))}))
        else:
            k = int(rng.integers(0, 4))
            words = [TERMS[i] for i in rng.choice(len(TERMS), size=k, replace=False)]
            record = {"type": "object", "id": f"o{objects}", "x": _coordinate(rng), "y": _coordinate(rng)}
            record.update({"text": " ".join(words)} if rng.random() < 0.3 else {"terms": words})
            objects += 1
            lines.append(json.dumps(record))
    if invalid:
        for line, _ in INVALID_LINES:
            lines.insert(int(rng.integers(len(lines) + 1)), line)
        for dup in (
            '{"type": "object", "id": "o1", "x": 1, "y": 1, "text": "sushi"}',
            '{"type": "subscribe", "id": "s0", "kind": "range", "rect": [0, 0, 100, 100], "keywords": ["sushi"]}',
        ):
            lines.insert(int(rng.integers(len(lines) // 2, len(lines) + 1)), dup)
    return lines


def _ranked_subscription(rng: np.random.Generator, sid: str) -> dict:
    point = [_coordinate(rng), _coordinate(rng)]
    k = int(rng.integers(1, 6))
    words = [TERMS[i] for i in rng.choice(len(TERMS), size=int(rng.integers(1, 4)), replace=False)]
    if rng.random() < 0.5:
        alpha = float(rng.choice([0.0, 0.5, 1.0, round(float(rng.random()), 3)]))
        record = {"type": "subscribe", "id": sid, "kind": "topk", "point": point, "k": k, "alpha": alpha}
        if rng.random() < 0.5:
            record["keywords"] = words
        else:
            record["weights"] = {w: float(rng.choice([1.0, 2.0, 0.5])) for w in words}
        return record
    record = {"type": "subscribe", "id": sid, "kind": "knn", "point": point, "k": k, "keywords": words}
    if rng.random() < 0.5:
        record["match"] = str(rng.choice(["any", "all"]))
    if rng.random() < 0.3:
        record["from"] = str(rng.choice(["window", "registration"]))
    return record


def ranked_workload(seed: int, n: int = 600, times: bool = True) -> list[str]:
    """Return ``n`` valid JSON lines mixing objects, range, topk and knn subscriptions, unsubscribes, snapshots.

    Objects sit on a coarse lattice (exact distance ties) or beside one by a
    few 1e-10 (near ties that chain); with ``times`` some carry ``ts``
    (sometimes late) and ``expires_at``.
    """
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    active: list[str] = []
    objects = subs = snaps = 0
    clock = 0.0
    for _ in range(n):
        u = rng.random()
        if u < 0.12:
            sid = f"s{subs}"
            subs += 1
            if rng.random() < 0.3:
                x0, x1 = sorted((_coordinate(rng), _coordinate(rng)))
                y0, y1 = sorted((_coordinate(rng), _coordinate(rng)))
                record = {"type": "subscribe", "id": sid, "kind": "range", "rect": [x0, y0, x1, y1], **_expression(rng)}
            else:
                record = _ranked_subscription(rng, sid)
            lines.append(json.dumps(record))
            active.append(sid)
        elif u < 0.16 and active:
            lines.append(json.dumps({"type": "unsubscribe", "id": active.pop(int(rng.integers(len(active))))}))
        elif u < 0.19:
            lines.append(json.dumps({"type": "snapshot", "id": f"q{snaps}"}))
            snaps += 1
        else:
            k = int(rng.integers(1, 4))
            words = [TERMS[i] for i in rng.choice(len(TERMS), size=k, replace=True)]
            x, y = float(rng.integers(0, 11) * 10.0), float(rng.integers(0, 11) * 10.0)
            if rng.random() < 0.3:
                x = min(100.0, x + float(rng.integers(0, 4)) * 4e-10)
            record = {"type": "object", "id": f"o{objects}", "x": x, "y": y, "terms": words}
            objects += 1
            if times and rng.random() < 0.7:
                clock += float(rng.integers(0, 3))
                record["ts"] = clock - float(rng.integers(0, 30)) if rng.random() < 0.1 else clock
            if times and rng.random() < 0.15:
                record["expires_at"] = clock + float(rng.integers(1, 20))
            lines.append(json.dumps(record))
    return lines


PROJECTED = Rect(-500_000.0, 4_000_000.0, 700_000.0, 4_900_000.0)
"""A projected space in metres (a UTM-like zone), nothing like :data:`SPACE`: for :func:`drifting_cluster_workload`."""
CLUSTER_TERMS = [f"w{i}" for i in range(40)] + ["Straße", "STRASSE", "ﬁsh", "fish", "日本"]


def drifting_cluster_workload(seed: int, n: int = 1500, grid: int = 64) -> list[str]:
    """Return ``n`` valid lines over :data:`PROJECTED`: a hot cluster that moves through four places.

    Data unlike :func:`random_workload`'s: metre coordinates in the millions,
    three quarters of the records in a Gaussian cluster whose centre jumps
    at each quarter of the stream (subscriptions follow it), Zipf-distributed
    terms among 45 (some equal after normalization), range, topk and knn
    subscriptions, unsubscribes, snapshots, and x coordinates on the borders
    of a ``grid`` x ``grid`` fine grid one time in five.
    """
    rng = np.random.default_rng(seed)
    zipf = 1 / np.arange(1, len(CLUSTER_TERMS) + 1) ** 1.1
    zipf /= zipf.sum()
    space = PROJECTED
    lines: list[str] = []
    active: list[str] = []
    objects = subs = snaps = 0
    clock = 0.0

    def point(centre: tuple[float, float], spread: float) -> tuple[float, float]:
        if rng.random() < 0.75:
            x, y = rng.normal(centre[0], space.width * spread), rng.normal(centre[1], space.height * spread)
        else:
            x, y = rng.uniform(space.xmin, space.xmax), rng.uniform(space.ymin, space.ymax)
        if rng.random() < 0.2:
            x = space.xmin + space.width * int(rng.integers(0, grid + 1)) / grid
        return float(np.clip(x, space.xmin, space.xmax)), float(np.clip(y, space.ymin, space.ymax))

    for i in range(n):
        phase = i * 4 // n
        centre = (space.xmin + space.width * (0.15 + 0.23 * phase), space.ymin + space.height * (0.8 - 0.2 * phase))
        u = rng.random()
        if u < 0.14:
            sid = f"S-{subs}"
            subs += 1
            words = [str(w) for w in rng.choice(CLUSTER_TERMS, size=int(rng.integers(1, 4)), p=zipf, replace=False)]
            x, y = point(centre, 0.05)
            kind = rng.random()
            if kind < 0.55:
                w, h = space.width * rng.uniform(0.002, 0.3), space.height * rng.uniform(0.002, 0.3)
                record = {"type": "subscribe", "id": sid, "kind": "range", "rect": [x - w, y - h, x + w, y + h]}
                joiner = " OR " if rng.random() < 0.5 else " AND "
                record.update({"keywords": words} if rng.random() < 0.5 else {"expr": joiner.join(words)})
            elif kind < 0.8:
                alpha = float(rng.choice([0.0, 0.3, 0.5, 1.0]))
                record = {"type": "subscribe", "id": sid, "kind": "topk", "point": [x, y], "k": int(rng.integers(1, 8))}
                record.update({"alpha": alpha, "keywords": words})
            else:
                record = {"type": "subscribe", "id": sid, "kind": "knn", "point": [x, y], "k": int(rng.integers(1, 8))}
                record["keywords"] = words
                if rng.random() < 0.5:
                    record["match"] = str(rng.choice(["any", "all"]))
            lines.append(json.dumps(record, ensure_ascii=False))
            active.append(sid)
        elif u < 0.19 and active:
            lines.append(json.dumps({"type": "unsubscribe", "id": active.pop(int(rng.integers(len(active))))}))
        elif u < 0.2:
            lines.append(json.dumps({"type": "snapshot", "id": f"Q{snaps}"}))
            snaps += 1
        else:
            x, y = point(centre, 0.04)
            words = [str(w) for w in rng.choice(CLUSTER_TERMS, size=int(rng.integers(1, 6)), p=zipf)]
            record = {"type": "object", "id": f"O{objects}", "x": x, "y": y}
            record.update({"text": " ".join(words)} if rng.random() < 0.4 else {"terms": words})
            clock += float(rng.integers(0, 3))
            if rng.random() < 0.8:
                record["ts"] = clock
            objects += 1
            lines.append(json.dumps(record, ensure_ascii=False))
    return lines


def projected_deployment(router: str, evaluators: int, batch_size: int, balancer: BalancerConfig, window=None):
    """A deployment over :data:`PROJECTED` (64 x 64 fine grid) whose balancer acts on small imbalances."""
    return Deployment(
        space=PROJECTED, evaluators=evaluators, router=router, batch_size=batch_size, grid_size=64, index_block=3,
        sample_size=300, window=window or Window(), balancer=balancer,
    )  # fmt: skip


def object_ids(lines: list[str] | list[bytes]) -> list[str]:
    """Return the distinct string ids of the object lines among ``lines`` (invalid lines skipped), sorted."""
    return sorted(set(_object_id_list(lines)))


def recurring_object_ids(lines: list[str] | list[bytes]) -> frozenset[str]:
    """Return the string ids that two or more object lines among ``lines`` carry."""
    return frozenset(oid for oid, n in Counter(_object_id_list(lines)).items() if n > 1)


def _object_id_list(lines: list[str] | list[bytes]) -> list[str]:
    """Return the string id of every object line among ``lines``, in order (invalid lines skipped)."""
    ids = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a hostile line nests deeper than json reads
            continue
        if isinstance(record, dict) and record.get("type") == "object" and isinstance(record.get("id"), str):
            ids.append(record["id"])
    return ids


def write_lines(path, lines: list[str] | list[bytes]) -> None:
    """Write ``lines`` (str as UTF-8, bytes as they are) as a JSON-lines file."""
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))


def canonical(rows: list[dict]) -> list[tuple]:
    """Order-free comparison form of output rows (duplicates kept, so they show)."""
    return sorted(tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in row.items())) for row in rows)


def letters(rows: list[dict]) -> list[tuple[str, str]]:
    """Dead letters as the oracle is compared on them: ``(line, reason)``, sorted (a ``message`` is free text)."""
    return sorted((row["line"], row["reason"]) for row in rows)


class RankedFold:
    """Each topk/knn subscription's result, folded from its events in order, checking that each one is possible.

    A result is a multiset of object ids: an id of ``recurring`` (one the stream gives to several objects, after
    the object-id horizon) may be in one result twice (SEMANTICS section 4); any other id entering a result that
    holds it already, or leaving one that does not hold it, is an error.
    """

    def __init__(self, recurring: frozenset[str] = frozenset()) -> None:
        self.recurring = recurring
        self.held: dict[str, Counter[str]] = {}

    def apply(self, events: list[dict]) -> RankedFold:
        for event in events:
            mine = self.held.setdefault(event["sub"], Counter())
            if event["event"] == "enter":
                assert not mine[event["obj"]] or event["obj"] in self.recurring, event
                mine[event["obj"]] += 1
            else:
                assert mine[event["obj"]] > 0, event
                mine[event["obj"]] -= 1
        return self

    def results(self) -> dict[str, Counter[str]]:
        return {sub: +objs for sub, objs in self.held.items() if +objs}


def results_from_events(events: list[dict], recurring: frozenset[str] = frozenset()) -> dict[str, Counter[str]]:
    """Fold events in order (:class:`RankedFold`) and return the results they leave."""
    return RankedFold(recurring).apply(events).results()


def assert_outputs_equal_oracle(
    out, lines: list, dep: Deployment, exact_events: bool = False, expected=None, boundaries: bool = True
):
    """Check a run's output directory against the oracle; return the oracle's result.

    Range matches and dead letters as sets; snapshots exactly, in order;
    topk/knn events fold to the oracle's final results, and with
    ``exact_events`` (micro-batches of one record) equal its events per
    subscription, in order. With ``boundaries`` (micro-batches of
    ``dep.batch_size`` lines, as both engines cut a file of short lines),
    also batch by batch: each batch's range matches are the oracle's for
    its lines, and the topk/knn results at the end of each batch are the
    oracle's after its last line, and its events are the oracle's for its
    lines less some that cancel (SEMANTICS section 5: a batch may coalesce
    an enter and an exit inside it, never across its end). ``expected``
    is the oracle's result when the caller has it already.
    """
    from skpub.kernel.oracle import replay
    from skpub.kernel.parts import read_stream

    expected = replay(lines, dep) if expected is None else expected
    deliveries = read_stream(out, "deliveries")
    matches = [d for d in deliveries if d["event"] == "match"]
    events = [d for d in deliveries if d["event"] != "match"]
    wanted = [d for d in expected.deliveries if d["event"] != "match"]
    assert canonical(matches) == canonical([d for d in expected.deliveries if d["event"] == "match"])
    assert letters(read_stream(out, "dead_letters")) == letters(expected.dead_letters)
    assert read_stream(out, "snapshots") == expected.snapshots
    recurring = recurring_object_ids(lines)
    assert results_from_events(events, recurring) == results_from_events(wanted, recurring)
    if exact_events:
        for sub in {d["sub"] for d in wanted} | {d["sub"] for d in events}:
            assert [d for d in events if d["sub"] == sub] == [d for d in wanted if d["sub"] == sub]
    if boundaries:
        assert_batches_equal_oracle(out, lines, dep.batch_size, expected, recurring)
    return expected


def assert_batches_equal_oracle(out, lines: list, batch_size: int, expected, recurring: frozenset[str]) -> None:
    """Each batch of ``batch_size`` lines: its range matches, and the ranked results at its end, are the oracle's."""
    from skpub.kernel.parts import read_batches

    by_batch = read_batches(out, "deliveries")
    count = -(-len(lines) // batch_size)
    assert set(by_batch) <= set(range(count)), f"deliveries of batches past the last, {count - 1}"
    engine, oracle = RankedFold(recurring), RankedFold(recurring)
    for batch in range(count):
        first, last = batch * batch_size, min(len(lines), (batch + 1) * batch_size) - 1
        mine = by_batch.get(batch, [])
        due = expected.deliveries[expected.delivered_after[first - 1] if first else 0 : expected.delivered_after[last]]
        where = f"batch {batch} (lines {first}..{last})"
        got, want = ([d for d in rows if d["event"] == "match"] for rows in (mine, due))
        assert canonical(got) == canonical(want), where
        events, wanted = ([d for d in rows if d["event"] != "match"] for rows in (mine, due))
        # coalescing only leaves out an enter and an exit that cancel: every event sent is one of the oracle's
        assert Counter(canonical(events)) <= Counter(canonical(wanted)), where
        engine.apply(events)
        oracle.apply(wanted)
        assert engine.results() == oracle.results(), where


def object_batch(objects, cells, only=None):
    """The :class:`ObjectBatch` of ``objects`` (records) in fine cells ``cells``; ``only`` per object or None."""
    return ObjectBatch(
        np.array([o.pos for o in objects], dtype=np.int64),
        np.array([o.x for o in objects], dtype=np.float64),
        np.array([o.y for o in objects], dtype=np.float64),
        np.array([c[0] for c in cells], dtype=np.int64),
        np.array([c[1] for c in cells], dtype=np.int64),
        pa.array([list(o.terms) for o in objects], pa.list_(pa.string())),
        None if only is None else pa.array([None if t is None else sorted(t) for t in only], pa.list_(pa.string())),
    )


def match_one(index, obj, cx, cy, only=None):
    """Match one object: its matched ids (in subscribe-position order) and candidates examined."""
    found = index.match_many(object_batch([obj], [(cx, cy)], None if only is None else [only]))
    return found.sids.to_pylist(), int(found.examined[0])
