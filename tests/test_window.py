"""The columnar window store against a model that keeps objects one by one (issue 43 item 5).

The store keeps a micro-batch's objects in bulk, lets them arrive by
position, forgets what has left lazily, merges and rewrites chunks, and is
saved as segments; the model is a plain dict of the objects held, changed
at each row as the window's rules say (SEMANTICS 4). Every answer the
monitor asks of the store (how many are held, is one held, which share a
term, does any) must equal the model's at every point between rows, across
restores from the saved segments.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from skpub.evaluators.window import (
    MERGE_ROWS,
    Departures,
    WindowColumns,
    WindowStore,
    decode_segment,
    encode_segment,
)
from skpub.kernel.config import Window
from skpub.kernel.records import stream_position as position

TERMS = ("a", "b", "c", "d")


def _held(model: dict, kind: str, size: float, accepted: int, watermark: float) -> dict:
    """Return the model's objects that have not left the window at clock ``(accepted, watermark)``."""

    def stays(o: dict) -> bool:
        if watermark >= o["expires"]:
            return False
        if kind == "count":
            return o["number"] >= accepted - size
        if kind == "seconds":
            return o["ts"] > watermark - size
        return True

    return {pos: o for pos, o in model.items() if stays(o)}


def _columns(objects: list[dict]) -> WindowColumns:
    return WindowColumns(
        np.array([o["pos"] for o in objects], np.int64),
        pa.array([o["id"] for o in objects], pa.string()),
        np.array([o["x"] for o in objects], np.float64),
        np.array([o["y"] for o in objects], np.float64),
        pa.array([list(o["terms"]) for o in objects], pa.list_(pa.string())),
        np.array([o["ts"] for o in objects], np.float64),
        np.array([o["expires"] for o in objects], np.float64),
        np.array([o["number"] for o in objects], np.int64),
        np.zeros(len(objects), np.int64),
    )


_row = st.fixed_dictionaries(
    {
        "terms": st.lists(st.sampled_from(TERMS), max_size=3),
        "dt": st.sampled_from([0.0, 0.5, 1.0, 3.0]),
        "late": st.booleans(),  # an object time behind the watermark
        "expires_in": st.sampled_from([math.inf, math.inf, 0.5, 2.0, 6.0]),
        "query": st.sampled_from(["none", "len", "shares", "sharing", "contains", "discard", "before"]),
        "no_watermark": st.booleans(),  # a row stamped before any watermark (NaN), which moves no clock
        "interest": st.one_of(st.none(), st.lists(st.sampled_from(TERMS), max_size=2)),
        "terms_asked": st.lists(st.sampled_from(TERMS), min_size=1, max_size=2),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["count", "seconds", "none"]),
    size=st.sampled_from([1, 3, 8]),
    batches=st.lists(st.lists(_row, max_size=14), min_size=1, max_size=6),
    restores=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_the_store_answers_as_a_window_kept_object_by_object(kind, size, batches, restores):
    window = Window(kind, float(size))
    store = WindowStore(window, durable=True)
    saved: dict[int, bytes] = {}
    model: dict[int, dict] = {}
    tracked: set[int] = set()
    departures = Departures(store, tracked)
    ever: set[int] = set()
    discarded: set[int] = set()  # a saved segment keeps them: a restored monitor discards them again
    accepted, watermark, clock_ts = 0, -math.inf, 0.0
    for batch_id, rows in enumerate(batches):
        objects = []
        for i, row in enumerate(rows):
            clock_ts += row["dt"]
            ts = clock_ts - 2.5 if row["late"] else clock_ts
            accepted += 1
            objects.append(
                {
                    "pos": position(batch_id, 2 * i + 1), "id": f"o{batch_id}-{i}", "x": float(i), "y": 0.0,
                    "terms": tuple(row["terms"]), "ts": ts, "expires": ts + row["expires_in"],
                    "number": accepted - 1, "accepted": accepted,
                    "watermark": math.nan if row["no_watermark"] else clock_ts,
                }
            )  # fmt: skip
        cols = _columns(objects)
        if objects:  # what RankedMonitor.receive does: each object held at its own row's clock
            stamped = np.array([o["accepted"] for o in objects]), np.array([o["watermark"] for o in objects])
            kept = store.holds_many(cols, *stamped)
            store.add(cols.take(np.flatnonzero(kept)))
        for obj, row in zip(objects, rows, strict=True):
            store.advance(obj["accepted"], obj["watermark"])
            if not math.isnan(obj["watermark"]):
                watermark = max(watermark, obj["watermark"])
            if row["interest"] is not None:  # the terms of interest name what lookups will ask; others still work
                store.interest(row["interest"])
            model = _held(model, kind, size, obj["accepted"], watermark)
            left = set(departures.left())
            assert not (tracked - left) & (tracked - set(model)), "a tracked object left unnoticed"
            tracked -= left
            store.arrive_until(obj["pos"] + 1)
            if _held({obj["pos"]: obj}, kind, size, obj["accepted"], watermark):
                model[obj["pos"]] = obj
                if row["terms"]:
                    got = store.get(obj["pos"])
                    assert got is not None and got.terms == obj["terms"] and got.number == obj["number"]
                    departures.track(got)
                    tracked.add(obj["pos"])
            ever.add(obj["pos"])
            gone = _ask(store, model, row, ever)
            discarded |= gone
            tracked -= gone
        store.arrive_until(math.inf)
        assert len(store) == len(model)
        for segment, data in store.take_segments().items():
            if data is None:
                saved.pop(segment, None)
            else:
                saved[segment] = data
        if restores[batch_id % len(restores)]:
            store = WindowStore.restore(window, store.accepted, store.watermark, saved)
            store.discard(sorted(discarded))
            tracked = set()
            departures = Departures(store, tracked)
            assert sorted(_positions(store)) == sorted(model)
        assert sum(len(decode_segment(data)) for data in saved.values()) >= len(model)


def _positions(store: WindowStore) -> list[int]:
    held = store.held()
    return [] if held is None else held.pos.tolist()


def _ask(store: WindowStore, model: dict, row: dict, ever: set[int]) -> set[int]:
    """Ask the store ``row["query"]`` between rows and check it against the model (``ever``: every position seen).

    Returns the positions a ``discard`` or ``before`` query made the store forget.
    """
    asked = set(row["terms_asked"])
    sharing = sorted(pos for pos, o in model.items() if asked & set(o["terms"]))
    query, gone = row["query"], []
    if query == "len":
        assert len(store) == len(model)
    elif query == "shares":
        assert store.shares_any(asked) == bool(sharing)
    elif query == "sharing":
        assert [o.pos for o in store.sharing(sorted(asked))] == sharing
        rarest = {o.pos for o in store.sharing(sorted(asked), rarest_only=True)}
        every = {pos for pos, o in model.items() if asked <= set(o["terms"])}
        assert every <= rarest <= set(sharing)
    elif query == "contains":
        assert all(pos in store for pos in model)
        assert not any(pos in store for pos in ever - set(model))
    elif query == "discard" and model:
        victim = min(model)
        gone = store.discard([victim]).tolist()
        assert gone == [victim]
        del model[victim]
        assert victim not in store
    elif query == "before" and model:
        bound = sorted(model)[len(model) // 2]
        gone = store.discard_before(bound).tolist()
        assert sorted(gone) == sorted(p for p in model if p < bound)
        for p in gone:
            del model[p]
    assert _positions(store) == sorted(model)
    return set(gone)


def test_a_segment_an_earlier_skpub_wrote_reads_as_columns():
    """The rows of a window segment keep their JSON form: one written before the columns reads the same."""
    data = (
        b'{"format":1,"objects":[[4294967297,"o1",1.5,-2.0,["jazz","jazz","caf\\u00e9"],10.0,null,7,1048577],'
        b'[4294967299,"o2",0.0,0.0,[],11.5,20.0,8,0]]}'
    )
    cols = decode_segment(data)
    assert cols.pos.tolist() == [4294967297, 4294967299] and cols.ids.to_pylist() == ["o1", "o2"]
    first, second = cols.objects()
    assert (first.x, first.y, first.terms, first.ts, first.expires_at, first.number, first.block) == (
        1.5, -2.0, ("jazz", "jazz", "caf\u00e9"), 10.0, math.inf, 7, 1048577
    )  # fmt: skip
    assert (second.terms, second.expires_at) == ((), 20.0)
    again = encode_segment(cols)
    assert encode_segment(decode_segment(again)) == again


_FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e300, 0.1])
_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=6) | st.sampled_from(['"', "\\", "\x00\x1f", "é"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            _TEXT,
            _FLOATS,
            _FLOATS,
            st.lists(_TEXT, max_size=4),
            _FLOATS | st.just(math.nan),
            _FLOATS | st.sampled_from([math.inf, math.nan]),
        ),  # fmt: skip
        max_size=30,
    ),
    st.data(),
)
def test_segments_written_in_arrow_are_the_json_orjson_writes(objects, data):
    """encode_segment's text, written in Arrow, is the document orjson writes of the rows (issue 43, item 5).

    Strings with quotes, backslashes and control characters, -0.0, the
    smallest and largest floats, and no expiry (null) included; a slice of
    the columns (a ``take``) writes the same as the rows it holds.
    """
    import orjson

    cols = _columns(
        [
            {
                "pos": 7 * i,
                "id": oid,
                "x": x,
                "y": y,
                "terms": tuple(terms),
                "ts": ts,
                "expires": expires,
                "number": i,
                "block": 0,
            }
            for i, (oid, x, y, terms, ts, expires) in enumerate(objects)
        ]  # fmt: skip
    )
    rows = data.draw(st.lists(st.integers(0, max(len(objects) - 1, 0)), max_size=len(objects))) if objects else []
    cols = cols.take(np.array(sorted(rows), np.int64))
    written = encode_segment(cols)
    rows = [
        [o.pos, o.id, o.x, o.y, list(o.terms), o.ts, None if o.expires_at == math.inf else o.expires_at, o.number, 0]
        for o in cols.objects()
    ]  # what encode_segment wrote with orjson before (a NaN as null)
    assert orjson.loads(written) == orjson.loads(orjson.dumps({"format": 1, "objects": rows}))
    again = decode_segment(written)
    for name in ("pos", "number", "block"):
        assert getattr(again, name).tolist() == getattr(cols, name).tolist(), name
    for name in ("x", "y", "ts", "expires"):
        a, b = getattr(again, name), getattr(cols, name)
        same = (a == b) & (np.signbit(a) == np.signbit(b))  # -0.0 kept
        assert (same | (np.isnan(a) & np.isnan(b)) | ((name == "expires") & np.isnan(b) & (a == math.inf))).all()
    assert again.ids.equals(cols.ids) and again.terms.to_pylist() == cols.terms.to_pylist()


def test_many_small_batches_keep_few_chunks_and_the_same_objects():
    """Batches of one object merge into chunks of at most MERGE_ROWS; a count window evicts the oldest exactly."""
    store = WindowStore(Window("count", 3000.0))
    for n in range(6000):
        cols = _columns(
            [{"pos": position(n, 0), "id": f"o{n}", "x": 0.0, "y": 0.0, "terms": ("a",) if n % 7 else ("b",),
              "ts": float(n), "expires": math.inf, "number": n}]
        )  # fmt: skip
        store.advance(n + 1, float(n))
        store.add(cols)
        store.arrive_until(math.inf)
    assert len(store) == 3000
    assert _positions(store) == [position(n, 0) for n in range(3000, 6000)]
    assert len(store._chunks) <= 3000 // MERGE_ROWS + 2 + math.ceil(math.log2(3000))
    assert [o.pos for o in store.sharing(["b"])] == [position(n, 0) for n in range(3000, 6000) if n % 7 == 0]


def test_the_heaps_follow_what_is_held_not_the_stream():
    """Far-off expiries: the store's heaps keep O(chunks) entries and Departures O(objects watched)."""
    store = WindowStore(Window("count", 100.0))
    watched: set[int] = set()
    departures = Departures(store, watched)
    for n in range(5000):
        pos = position(n, 0)
        cols = _columns(
            [{"pos": pos, "id": f"o{n}", "x": 0.0, "y": 0.0, "terms": ("a",), "ts": float(n),
              "expires": 1e9 + n, "number": n}]
        )  # fmt: skip
        store.advance(n + 1, float(n))
        store.add(cols)
        store.arrive_until(math.inf)
        departures.track(store.get(pos))
        watched.add(pos)
        watched.discard(position(n - 10, 0))  # a buffer lets go of what it held ten objects ago
        watched.difference_update(departures.left())
    assert len(store) == 100
    assert all(len(heap) <= 2 * len(store._chunks) + 65 for heap in store._heaps.values())
    assert all(len(heap) <= 2 * len(watched) + 65 for heap in departures.heaps.values())
