"""Deployment configuration: space, window, evaluators, router and grids.

A deployment is read from a JSON file (``--config FILE``) whose keys are the
fields of :class:`Deployment`; command-line flags override the file. Example::

    {"space": [-180, -90, 180, 90], "window": {"kind": "count", "size": 100000},
     "evaluators": 8, "router": "agrid", "grid_size": 1000,
     "vocabulary": "vocabulary.json"}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from skpub.kernel.errors import ConfigError
from skpub.kernel.geometry import Rect
from skpub.kernel.grid import grid_shape
from skpub.kernel.horizon import memory_bytes

MAX_RECORD_BYTES = 1 << 20
"""Default largest record line, bytes (SEMANTICS section 1, ``too_large``)."""

DEFAULT_OBJECT_ID_HORIZON = 1_000_000
"""Default object-id horizon: accepted object ids among which an id is a duplicate (SEMANTICS section 1)."""

ROUTERS = ("agrid", "kdt", "kdtree", "text", "uniform")
INTEGER_FIELDS = (
    "evaluators", "grid_size", "index_block", "batch_size", "sample_size", "max_record_bytes", "object_id_horizon",
)  # fmt: skip
MAX_EVALUATORS = 1024
"""Most evaluators a deployment may have (each costs a core, its state and a share of every batch's overhead)."""
INTEGER_LIMITS = {
    "evaluators": MAX_EVALUATORS, "batch_size": 10_000_000, "sample_size": 10_000_000, "max_record_bytes": 64 << 20,
}  # fmt: skip
"""Upper bounds of integer fields, beside the memory estimate: records held in memory at once, and evaluators (whose
per-batch overhead, not memory, makes thousands of them useless)."""
INDEX_SIDE = 1 << 15
"""Most GI^2 index cells per side (``ceil(grid_size / index_block)``): a cell is 30 bits of a posting code."""
GRID_BYTES_PER_CELL = 48
EVALUATOR_BYTES = 64 * 1024


def physical_memory() -> int:
    """Bytes of physical memory of this machine (``sysconf``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


WINDOW_KINDS = ("none", "count", "seconds")
SKYBANDS = ("cskyband", "kmax", "topk")
"""Buffer policies of top-k/kNN subscriptions (``skpub.evaluators.skyband``): Skype's cost-based k-skyband,
the kmax baseline, the first k only."""


@dataclass(frozen=True, slots=True)
class Window:
    """The deployment window (SEMANTICS section 4).

    ``kind`` is ``none``, ``count`` (``size`` = W objects) or ``seconds``
    (``size`` = T seconds). Range subscriptions do not depend on it.
    """

    kind: str = "none"
    size: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in WINDOW_KINDS:
            raise ConfigError(f"window kind must be one of {WINDOW_KINDS}, got {self.kind!r}")
        if self.kind != "none" and not (math.isfinite(self.size) and self.size > 0):
            raise ConfigError(f"window size must be a positive number, got {self.size!r}")
        if self.kind == "count" and not float(self.size).is_integer():
            raise ConfigError(f"a count window holds a whole number of objects, got {self.size!r}")


BALANCER_MODES = ("adaptive", "off", "chaos")


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """How the balancer decides (``skpub.balancer.policy``; DESIGN "The balancer").

    Attributes
    ----------
    mode : str
        ``adaptive`` (the cost-based policy, the default), ``off`` (keep the
        initial partitioning) or ``chaos`` (one legal operation at random
        whenever none is in flight, seeded: rebalancing must never change a
        result).
    seed : int
        Seed of ``chaos``, with the batch id.
    sigma : float
        Balance constraint: ``adaptive`` acts only when max / mean evaluator cost > sigma (>= 1).
    beta : float
        Tornado's beta: cost units per subscription moved (C_t = beta x
        subscriptions, Eq. 5). ``python -m benchmarks.balancer --parts
        drift`` measures it per stream (30-50 heavy, 195-341 light); 60 is
        kept as the default (``docs/benchmarks.md`` (f)).
    decay : float
        Weight of the past per batch in the load statistics, in (0, 1):
        0.25, the last batch weighs three quarters, so a decision made
        after a hot spot moves sees its new place, not the old one's
        remains (``docs/benchmarks.md`` (f), the decay sweep).
    horizon : int
        Batches over which an operation's gain is counted: ``adaptive`` takes
        an operation when C_r x (1 - decay) x horizon > C_t (C_r, on decayed
        costs, is about 1 / (1 - decay) batches of reduction).
    global_period : int
        Every this many batches ``adaptive`` also weighs PS2Stream V-B's
        global adjustment (a repartitioning of the space on the recent load,
        ``skpub.balancer.globaladjust``); 0: never.
    object_cost : int
        Cost units of one object an evaluator receives, beside its
        candidates (one unit each, Tornado Eq. 1): taking the object in,
        whether or not a subscription matches it (PS2Stream Definition 1's
        c2 against c1). 10: the evaluators spend 8-26 candidates' CPU per
        object on the GeoNames streams, and on the drifting hot spot the
        balancer's decisions with 10 leave every phase more even than with
        one unit, in either unit and in evaluator CPU (max/mean per phase
        1.9-2.4 -> 1.5-1.7 in this one; ``docs/benchmarks.md`` (f)). The
        evaluators' statistics count it; the initial partitioning keeps one
        unit per object of its sample (:mod:`skpub.router.initial`).
    """

    mode: str = "adaptive"
    seed: int = 0
    sigma: float = 1.2
    beta: float = 60.0
    decay: float = 0.25
    horizon: int = 10
    global_period: int = 50
    object_cost: int = 10

    def __post_init__(self) -> None:
        if self.mode not in BALANCER_MODES:
            raise ConfigError(f"balancer mode must be one of {BALANCER_MODES}, got {self.mode!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"balancer seed must be an integer >= 0, got {self.seed!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 1 and math.isfinite(self.beta) and self.beta >= 0):
            raise ConfigError(f"balancer sigma must be >= 1 and beta >= 0, got {self.sigma!r} and {self.beta!r}")
        if not 0 < self.decay < 1:
            raise ConfigError(f"balancer decay must be in (0, 1), got {self.decay!r}")
        if not isinstance(self.horizon, int) or isinstance(self.horizon, bool) or not 1 <= self.horizon <= 1_000_000:
            raise ConfigError(f"balancer horizon must be an integer in 1 .. 1,000,000, got {self.horizon!r}")
        period = self.global_period
        if not isinstance(period, int) or isinstance(period, bool) or not 0 <= period <= 1_000_000_000:
            raise ConfigError(f"balancer global_period must be an integer in 0 .. 10^9, got {period!r}")
        cost = self.object_cost
        if not isinstance(cost, int) or isinstance(cost, bool) or not 1 <= cost <= 1_000_000:
            raise ConfigError(f"balancer object_cost must be an integer in 1 .. 1,000,000, got {cost!r}")


@dataclass(frozen=True, slots=True)
class Deployment:
    """Everything that shapes routing and evaluation.

    Attributes
    ----------
    space : Rect
        The data space, in coordinate units (degrees for GeoNames).
    window : Window
        The window of SEMANTICS section 4.
    evaluators : int
        Number of evaluators (partitions of the initial A-Grid), >= 1.
    router : str
        ``agrid`` (Tornado A-Grid with cost-based partitioning), ``kdtree``
        (a load-balanced kd-tree's leaves, PS2Stream VI-B's space baseline) or
        ``uniform`` (Uni-Space-Rout: equal spatial partitions, Tornado section 5.1),
        ``text`` (every cell partitioned by terms, PS2Stream VI-B's metric-based
        baseline) or ``kdt`` (PS2Stream's hybrid kd^t-tree, section IV-B).
    grid_size : int
        Fine grid cells per side (Tornado section 3.1); default 1000 x 1000.
    index_block : int
        Fine cells per side of one GI^2 index cell inside an evaluator.
    batch_size : int
        Records per micro-batch (the Spark trigger size and the local batch).
    vocabulary : str or None
        Path of the vocabulary file (``{"N": n, "df": {...}}``), or None.
    vocabulary_digest : str or None
        SHA-256 of the vocabulary file's content, hex (64 characters), as
        the run that recorded this deployment read it
        (:func:`skpub.kernel.text.pin_vocabulary`);
        every process that loads the file checks it. None: not yet read
        (or recorded by an skpub before 2026-11-29, and then not checked).
    sample_size : int
        Records read from the stream head to compute the initial partitioning
        (Tornado section 4.1).
    max_record_bytes : int
        Input lines longer than this many bytes are ``too_large`` dead letters
        (SEMANTICS section 1); default 1 MiB.
    object_id_horizon : int
        Object ids are unique among the most recent this many accepted
        objects; the routing unit's memory for object ids is bounded by it
        (SEMANTICS section 1); default 1,000,000.
    skyband : str
        The buffer policy of top-k/kNN subscriptions, one of :data:`SKYBANDS`
        (default ``cskyband``, Skype section 6); it never changes results.
    balancer : BalancerConfig
        The balancer's mode and parameters (default ``adaptive``).
    """

    space: Rect = field(default_factory=lambda: Rect(-180.0, -90.0, 180.0, 90.0))
    window: Window = field(default_factory=Window)
    evaluators: int = 4
    router: str = "agrid"
    grid_size: int = 1000
    index_block: int = 4
    batch_size: int = 100_000
    vocabulary: str | None = None
    vocabulary_digest: str | None = None
    sample_size: int = 50_000
    max_record_bytes: int = MAX_RECORD_BYTES
    object_id_horizon: int = DEFAULT_OBJECT_ID_HORIZON
    skyband: str = "cskyband"
    balancer: BalancerConfig = field(default_factory=BalancerConfig)

    def __post_init__(self) -> None:
        s = self.space
        if not all(math.isfinite(v) for v in s.as_list()) or s.xmin >= s.xmax or s.ymin >= s.ymax:
            raise ConfigError(f"space must be a finite non-empty rectangle, got {s.as_list()}")
        if not math.isfinite(math.hypot(s.width, s.height)):
            raise ConfigError(f"space {s.as_list()} has a diagonal (MaxDist) beyond a 64-bit float")
        if self.router not in ROUTERS:
            raise ConfigError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.skyband not in SKYBANDS:
            raise ConfigError(f"skyband must be one of {SKYBANDS}, got {self.skyband!r}")
        for name in INTEGER_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
            if value > INTEGER_LIMITS.get(name, value):
                raise ConfigError(f"{name} must be at most {INTEGER_LIMITS[name]:,}, got {value:,}")
        if self.vocabulary is not None and not isinstance(self.vocabulary, str):
            raise ConfigError(f"vocabulary must be the path of a vocabulary file (a string), got {self.vocabulary!r}")
        if self.vocabulary_digest is not None:
            digest = self.vocabulary_digest
            if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")):
                raise ConfigError(f"vocabulary_digest must be a SHA-256 in lowercase hex, got {_shown(digest)}")
            if self.vocabulary is None:
                raise ConfigError("vocabulary_digest is given without a vocabulary")
        if self.evaluators > self.grid_size * self.grid_size:
            raise ConfigError("more evaluators than fine-grid cells")
        columns, rows = grid_shape(self.evaluators) if self.router == "uniform" else (1, 1)
        if max(columns, rows) > self.grid_size:
            raise ConfigError(
                f"the uniform router lays {self.evaluators} evaluators out as {columns} x {rows} ranges, more than a "
                f"{self.grid_size} x {self.grid_size} grid holds; choose a larger grid_size or another evaluator count"
            )
        need, have = self.memory_estimate(), physical_memory()
        if need > have // 2:
            raise ConfigError(
                f"grid_size={self.grid_size}, evaluators={self.evaluators} and object_id_horizon="
                f"{self.object_id_horizon} need about {need / 2**30:.1f} GiB for routing tables and the object-id "
                f"horizon alone, more than half of this machine's {have / 2**30:.1f} GiB; "
                "choose a smaller grid_size, fewer evaluators or a smaller object_id_horizon"
            )
        side = (self.grid_size - 1) // self.index_block + 1  # index cells a side: 0 .. side - 1
        if side > INDEX_SIDE:
            raise ConfigError(
                f"grid_size={self.grid_size} and index_block={self.index_block} make {side:,} GI^2 index cells a"
                f" side, more than its {INDEX_SIDE:,}; choose a larger index_block"
            )

    def memory_estimate(self) -> int:
        """Bytes the routing tables of this deployment take at least, before any record arrives.

        The fine grid's per-cell arrays (cost estimate, summed-area tables and
        the owner map: about ``GRID_BYTES_PER_CELL`` bytes per cell, Tornado
        section 4.1) plus per-evaluator structures (textual summaries,
        evaluator cores, statistics: about ``EVALUATOR_BYTES`` each), plus the
        object-id horizon (:func:`skpub.kernel.horizon.memory_bytes`). Checked
        before anything is allocated, so an impossible deployment is refused
        with a sentence instead of dying of memory.
        """
        grid = GRID_BYTES_PER_CELL * (self.grid_size + 1) ** 2 + EVALUATOR_BYTES * self.evaluators
        return grid + memory_bytes(self.object_id_horizon)

    def replace(self, **changes: Any) -> Deployment:
        """Return a copy with ``changes`` applied (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form read back by :func:`deployment_from_json`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["space"] = self.space.as_list()
        out["window"] = {"kind": self.window.kind, "size": self.window.size}
        out["balancer"] = {f.name: getattr(self.balancer, f.name) for f in dataclasses.fields(BalancerConfig)}
        return out


def deployment_changes(recorded: Any, wanted: Any, path: str = "") -> list[str]:
    """Return ``"key.path: recorded X, now Y"`` for each value where deployment JSON ``wanted`` differs from it.

    ``recorded`` is the recorded deployment JSON. What a refused resume names, so that the user can set the recorded
    values (a default that changed between skpub versions shows here). A key of :data:`UNCHECKED_WHEN_UNRECORDED`
    the record lacks (or holds as null) is not compared.
    O(keys).
    """
    if isinstance(recorded, dict) and isinstance(wanted, dict):
        return [
            line
            for key in sorted(set(recorded) | set(wanted), key=str)
            if not (key in UNCHECKED_WHEN_UNRECORDED and recorded.get(key) is None)
            for line in deployment_changes(recorded.get(key), wanted.get(key), f"{path}.{key}" if path else str(key))
        ]
    if recorded == wanted:
        return []
    if path.rsplit(".", 1)[-1] == "vocabulary_digest":
        short = [f"{d[:16]}..." if isinstance(d, str) else "none" for d in (recorded, wanted)]
        return [
            f"{path}: the vocabulary file's content is not the one recorded (SHA-256 recorded {short[0]}, "
            f"now {short[1]}): give the vocabulary file the run began with"
        ]
    return [f"{path or 'deployment'}: recorded {_shown(recorded)}, now {_shown(wanted)}"]


def _shown(value: Any, limit: int = 80) -> str:
    """Return ``value`` as JSON, cut to ``limit`` characters (an input fingerprint lists every file)."""
    text = json.dumps(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def changes_text(changes: list[str], shown: int = 5) -> str:
    """Return the first ``shown`` of :func:`deployment_changes`'s lines joined, and how many more there are."""
    more = f"; and {len(changes) - shown} more" if len(changes) > shown else ""
    return "; ".join(changes[:shown]) + more


UNCHECKED_WHEN_UNRECORDED = ("vocabulary_digest",)
"""Keys a deployment recorded before them lacks (or holds as null); such a record is resumed as before, unchecked
on them (:func:`deployment_changes`)."""

KEYS_ADDED: dict[tuple[str, str], Any] = {("balancer", "global_period"): 0, ("balancer", "object_cost"): 1}
"""``(section, key) -> value``: keys added to a section of the deployment after it existed, each with the value
under which skpub behaves as it did before the key (``global_period`` 0: no global adjustment is weighed, as
before 2026-11-26; ``object_cost`` 1: one cost unit per object, as before 2026-11-28).

A deployment recorded without one (a daemon's data directory, a Spark
checkpoint's manifest) is read with that value (:func:`recorded_json`), so a
resumed run counts and decides as its first attempt did; the key's default
applies to new deployments only.
"""


def recorded_json(raw: Any) -> Any:
    """Return recorded deployment JSON ``raw`` as read: each key of :data:`KEYS_ADDED` it lacks set to that value.

    Only a section the record has is filled in (a record without the
    section predates it, and takes the section's defaults). Anything but an
    object, and a section that is not one, is returned as it is
    (:func:`deployment_from_json` refuses it). ``raw`` is not changed.
    """
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    for (section, key), value in KEYS_ADDED.items():
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section] = {**out[section], key: value}
    return out


def deployment_from_json(raw: dict[str, Any]) -> Deployment:
    """Build a :class:`Deployment` from its JSON form.

    ``space`` is a list of four numbers ``[xmin, ymin, xmax, ymax]``,
    ``window`` an object of ``kind`` and ``size`` (a number), ``balancer``
    an object of :class:`BalancerConfig`'s fields; booleans are not numbers.

    Raises
    ------
    ConfigError
        On an unknown key (at the top, in ``window`` or in ``balancer``) or an
        invalid value.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a deployment is a JSON object, got {_shown(raw)}")
    _known_keys(raw, {f.name for f in dataclasses.fields(Deployment)}, "configuration keys")
    values = dict(raw)
    if "space" in values:
        space = values["space"]
        if not (isinstance(space, list) and len(space) == 4 and all(_is_number(v) for v in space)):
            raise ConfigError(f"space must be a list of four numbers [xmin, ymin, xmax, ymax], got {_shown(space)}")
        values["space"] = Rect(*(float(v) for v in space))
    if "window" in values:
        window = values["window"]
        if not isinstance(window, dict) or "kind" not in window:
            raise ConfigError(f'window must be an object {{"kind": ..., "size": ...}}, got {_shown(window)}')
        _known_keys(window, {"kind", "size"}, "window keys")
        size = window.get("size", 0)
        if not isinstance(window["kind"], str) or not _is_number(size):
            raise ConfigError(f"window kind must be a string and size a number, got {_shown(window)}")
        values["window"] = Window(window["kind"], float(size))
    if "balancer" in values:
        balancer = values["balancer"]
        if not isinstance(balancer, dict):
            raise ConfigError(f"balancer must be an object, got {_shown(balancer)}")
        _known_keys(balancer, {f.name for f in dataclasses.fields(BalancerConfig)}, "balancer keys")
        if not all(_is_number(balancer[k]) for k in ("sigma", "beta", "decay") if k in balancer):
            raise ConfigError(f"balancer sigma, beta and decay must be numbers, got {_shown(balancer)}")
        values["balancer"] = BalancerConfig(**balancer)
    return Deployment(**values)


def _is_number(value: Any) -> bool:
    """Return whether a decoded JSON value is a number (not a boolean) that a 64-bit float holds."""
    if isinstance(value, float):
        return True  # NaN and the infinities too: each field says why it refuses them
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= sys.float_info.max


def _known_keys(raw: dict[str, Any], known: set[str], what: str) -> None:
    """Raise :class:`ConfigError` naming the keys of ``raw`` outside ``known``."""
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown {what}: {sorted(unknown)}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses a key given twice in one object (JSON would keep the last silently)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        twice = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ConfigError(f"keys given twice in one object: {twice}")
    return out


@lru_cache(maxsize=4)
def deployment_from_text(text: str) -> Deployment:
    """Parse a deployment from its JSON text, cached per process (executors ship it as text)."""
    return deployment_from_json(json.loads(text, object_pairs_hook=_unique_keys))


def load_deployment(path: str | Path | None) -> Deployment:
    """Read a deployment JSON file; ``None`` gives the defaults.

    Raises
    ------
    ConfigError
        If the file cannot be read or is invalid.
    """
    if path is None:
        return Deployment()
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except (OSError, ValueError, ConfigError) as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"configuration {path} must be a JSON object")
    return deployment_from_json(raw)
