"""The object-id horizon: the last N accepted object ids, in memory sized at start.

SEMANTICS section 1 makes an object id a ``duplicate_id`` only among the most
recent ``object_id_horizon`` accepted objects (skpub's decision, so that the
memory for ids is bounded by the horizon, not by the stream). A Python set of
1,000,000 id strings costs ~100 bytes an id and grows while the horizon
fills (200 s at 5,000 objects/s): a long-running daemon's memory would climb
for minutes and only then settle. :class:`ObjectIdHorizon` keeps instead a
128-bit keyed hash of each id in arrays allocated, and written, when it is
made (~50 ms for N = 10^6): its memory is the same the first second and the
last (measured over 10-minute soaks at 5k/s, first to last minute: 1.20x
with zeroed pages committed as the ring fills, 1.09x and 1.12x written at
once with the hashes as base64 in the checkpoints, 1.01x with them written
raw from the ring, :meth:`hash_buffers`).

Layout (capacity ``N``, table size ``T``, the power of two >= 2N):

- a ring of ``N`` hashes (two ``uint64`` arrays, ``lo`` and ``hi``) by stream
  position ``p`` at slot ``p % N``;
- two open-addressing tables (linear probing on ``lo``, ``T`` slots of
  ``lo`` and position, load <= 1/2): the *newer* receives the ids accepted
  now; when it holds N, every id of the *older* is more than N acceptances
  old, so the older is emptied in one write and the two swap. An id leaves
  without a deletion: a match whose position is N or more behind the newest
  is not held. Memory :func:`memory_bytes`: ``16 N + 32 T`` bytes (80 MiB
  for N = 10^6).

Hashes are SipHash-2-4 (``pandas.util.hash_array``, in C) under two keys
drawn at random when a horizon is made and kept in its durable form, with
the hash of a fixed probe string that a restore recomputes (a pandas whose
hashes differ is refused, never misread): a client cannot aim ids at one
probe chain, and two ids are taken for one with probability ~ N / 2^128 per
object. Batches are vectorized in numpy; a batch
with an id held or repeated is decided one by one in stream order, exactly
as the one-at-a-time definition.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from skpub.kernel.errors import CheckpointError

_EMPTY = -1
_KEY = re.compile(r"[0-9a-f]{32}")
_PROBE = "skpub object-id horizon"


def table_size(capacity: int) -> int:
    """Slots of each of the two tables of a horizon of ``capacity``: the power of two >= 2 x capacity (>= 8)."""
    return 1 << max(3, (2 * capacity - 1).bit_length())


def memory_bytes(capacity: int) -> int:
    """Bytes a horizon of ``capacity`` ids holds at most: the ring (16 per id) and two tables (16 per slot)."""
    return 16 * capacity + 32 * table_size(capacity)


class _Table:
    """One generation of the horizon: ``lo`` hash -> stream position, linear probing, no deletion.

    ``slots`` is ``(T, 2)`` uint64, a slot's ``lo`` beside its position + 1
    (0: empty), so that a probe reads one cache line.
    """

    def __init__(self, size: int) -> None:
        self.slots = np.full((size, 2), 0, dtype=np.uint64)  # full, not zeros: every page written now
        self.count = 0

    def clear(self) -> None:
        self.slots[:, 1] = 0
        self.count = 0


class ObjectIdHorizon:
    """The last ``capacity`` accepted object ids (SEMANTICS section 1), as keyed 128-bit hashes.

    Parameters
    ----------
    capacity : int
        N, the number of most recent accepted ids held (>= 1).
    key : str, optional
        32 lowercase hex digits: the two SipHash keys (16 characters each,
        64 random bits each); drawn at random if omitted (pass the one of
        :meth:`to_json` to read its hashes).

    Memory :func:`memory_bytes` (``16 N + 32 T``, ``T`` = :func:`table_size`,
    the power of two >= max(2N, 8)), allocated and written here. :meth:`add` is O(batch)
    vectorized, plus O(T) once every N acceptances (a table emptied).
    """

    def __init__(self, capacity: int, key: str | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"an object-id horizon holds at least 1 id, not {capacity}")
        self.capacity = capacity
        self.key = key if key is not None else secrets.token_hex(16)
        size = table_size(capacity)
        self._mask = np.uint64(size - 1)
        self._older, self._newer = _Table(size), _Table(size)
        self._lo = np.full(capacity, 0, dtype=np.uint64)
        self._hi = np.full(capacity, 0, dtype=np.uint64)
        self._end = 0  # the position the next accepted id takes

    def __len__(self) -> int:
        return min(self._end, self.capacity)

    def __contains__(self, oid: str) -> bool:
        return bool(self.ages([oid])[0] >= 0)

    def ages(self, oids: Sequence[str]) -> np.ndarray:
        """Return, per id, how many ids were accepted after it (0: the newest), or -1 if it is not held.

        Shape ``(len(oids),)``, int64. Two horizons that answer alike for
        every id hold the same ids in the same order.
        """
        lo, hi = self._hash(oids)
        held = self._held(lo, hi)
        return np.where(held >= 0, self._end - 1 - held, -1)

    def add(self, oids: Sequence[str]) -> list[int]:
        """Accept ``oids`` in stream order; return the indices (into ``oids``) of those held already.

        An id is held if it is among the last ``capacity`` accepted at its
        turn, ids accepted earlier in this batch included; the others are
        accepted, the oldest held ids leaving as they come. O(n log n) for
        n = len(oids) (one sort), vectorized. ``oids`` are validated ids:
        ``str`` without lone surrogates (pandas' UTF-8 encoding raises
        UnicodeEncodeError on one).
        """
        if not oids:
            return []
        lo, hi = self._hash(oids)
        held = self._held(lo, hi)
        if held.max() < 0 and _distinct(lo):
            self._append(lo, hi)
            return []
        accepted, rejected = self._one_by_one(lo, hi, held)
        self._append(lo[accepted], hi[accepted])
        return rejected

    def to_json(self) -> dict[str, Any]:
        """Return the horizon's JSON part: its key, its probe check and how many hashes it holds.

        The hashes themselves are binary, apart (:meth:`hash_buffers`): a
        checkpoint writes them as they lie in the ring, with no copy.
        """
        return {"key": self.key, "check": self._check(), "count": len(self)}

    def hash_buffers(self) -> list[memoryview]:
        """Return the held hashes, oldest first, as byte buffers to write in order (no copy).

        Together ``16 n`` bytes for ``n = len(self)``: the ``n`` ``lo`` hashes,
        then the ``n`` ``hi`` hashes, each little-endian uint64. The buffers
        are views of the ring: write them before the next :meth:`add`.
        """
        end = self._end % self.capacity
        if self._end <= self.capacity:
            spans = [(0, self._end)]
        else:
            spans = [(end, self.capacity), (0, end)]
        return [
            memoryview(ring[a:b].astype("<u8", copy=False)).cast("B").toreadonly()
            for ring in (self._lo, self._hi)
            for a, b in spans
        ]

    @classmethod
    def from_json(cls, raw: Any, capacity: int, hashes: bytes | memoryview | None = None) -> ObjectIdHorizon:
        """Rebuild a horizon of ``capacity`` from :meth:`to_json` and the bytes of :meth:`hash_buffers`.

        ``hashes`` is ``None`` for the durable form of router state format 4,
        whose ``raw`` held them as base64 of ``(n, 2)`` little-endian uint64
        pairs (``lo``, ``hi``); still read.

        Raises
        ------
        CheckpointError
            If ``raw`` is not of that shape, the hashes are not ``count``
            whole pairs or more than ``capacity``, one is held twice, or the
            probe check differs from this pandas' hash (the hashes could not
            be compared with new ones).
        """
        try:
            key, check = raw["key"], raw["check"]
            if hashes is None:
                pairs = np.frombuffer(base64.b64decode(raw["hashes"], validate=True), dtype="<u8")
                if pairs.size % 2:
                    raise ValueError("a bad hash count")
                lo, hi = pairs[0::2], pairs[1::2]
            else:
                count = raw["count"]
                if type(count) is not int or not 0 <= count <= capacity or memoryview(hashes).nbytes != 16 * count:
                    raise ValueError("a bad hash count")
                both = np.frombuffer(hashes, dtype="<u8")
                lo, hi = both[:count], both[count:]
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
            raise CheckpointError(f"damaged object-id horizon: {exc!r}") from None
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key[:16] == key[16:]:
            raise CheckpointError("damaged object-id horizon: a bad key")
        if lo.size > capacity:
            raise CheckpointError("damaged object-id horizon: a bad hash count")
        if np.unique(np.stack([lo, hi], axis=1), axis=0).shape[0] != lo.size:
            raise CheckpointError("damaged object-id horizon: an id held twice")
        horizon = cls(capacity, key)
        if check != horizon._check():
            raise CheckpointError("the object-id horizon was hashed by another hash function (a different pandas?)")
        horizon._append(lo.astype(np.uint64), hi.astype(np.uint64))
        return horizon

    # ------------------------------------------------------------------ internals

    def _check(self) -> str:
        """Return the hashes of a fixed probe string under this key, as hex: what a restore must recompute alike."""
        lo, hi = self._hash([_PROBE])
        return f"{int(lo[0]):016x}{int(hi[0]):016x}"

    def _hash(self, oids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        values = np.asarray(oids, dtype=object)
        hashes = [pd.util.hash_array(values, hash_key=self.key[k : k + 16], categorize=False) for k in (0, 16)]
        return hashes[0], hashes[1]

    def _held(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Return, per hash, the position it is held at (-1: not held), int64."""
        return np.maximum(self._find(self._older, lo, hi), self._find(self._newer, lo, hi))

    def _find(self, table: _Table, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Probe ``table`` for every hash at once; positions of held matches, -1 elsewhere."""
        found = np.full(lo.size, _EMPTY, dtype=np.int64)
        oldest = max(self._end - self.capacity, 0)
        slot = (lo & self._mask).astype(np.intp)
        todo = np.arange(lo.size)
        while todo.size:
            rows = table.slots[slot[todo]]
            position = rows[:, 1].astype(np.int64) - 1
            hit = (rows[:, 0] == lo[todo]) & (position >= oldest)
            maybe = np.flatnonzero(hit)  # the ``hi`` half only where ``lo`` matches: rare but for held ids
            hit[maybe] = self._hi[position[maybe] % self.capacity] == hi[todo[maybe]]
            found[todo[hit]] = position[hit]
            todo = todo[(position != _EMPTY) & ~hit]
            slot[todo] = (slot[todo] + 1) & int(self._mask)
        return found

    def _one_by_one(self, lo: np.ndarray, hi: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Decide a batch in stream order (an id repeated, held, or leaving mid-batch); O(batch) in Python."""
        end, accepted, rejected = self._end, [], []
        newest: dict[tuple[int, int], int] = {}
        for k, pair in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            position = newest.get(pair, int(held[k]))
            if position >= 0 and position >= end - self.capacity:
                rejected.append(k)
            else:
                newest[pair] = end
                end += 1
                accepted.append(k)
        return np.asarray(accepted, dtype=np.intp), rejected

    def _append(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Take distinct, not held hashes as the newest, in order; the oldest leave past ``capacity``."""
        if lo.size >= self.capacity:  # only the newest N stay: every earlier id leaves
            self._end += lo.size - self.capacity
            lo, hi = lo[-self.capacity :], hi[-self.capacity :]
            self._older.clear()
            self._newer.clear()
        start = 0
        while start < lo.size:
            take = min(self.capacity - self._newer.count, lo.size - start)
            position = np.arange(self._end, self._end + take, dtype=np.int64)
            self._lo[position % self.capacity] = lo[start : start + take]
            self._hi[position % self.capacity] = hi[start : start + take]
            self._insert(self._newer, lo[start : start + take], position)
            self._end += take
            start += take
            if self._newer.count == self.capacity:  # every id of the older is now N or more behind
                self._older.clear()
                self._older, self._newer = self._newer, self._older

    def _insert(self, table: _Table, lo: np.ndarray, position: np.ndarray) -> None:
        """Put entries in their first empty probe slots, all at once (one winner per contested slot a round)."""
        slot = (lo & self._mask).astype(np.intp)
        stored = position.astype(np.uint64) + np.uint64(1)
        todo = np.arange(lo.size)
        while todo.size:
            at = slot[todo]
            free = np.flatnonzero(table.slots[at, 1] == 0)
            table.slots[at[free], 1] = stored[todo[free]]  # of entries aiming at one slot, one write stays
            won = free[table.slots[at[free], 1] == stored[todo[free]]]
            table.slots[at[won], 0] = lo[todo[won]]
            lost = np.ones(todo.size, dtype=bool)
            lost[won] = False
            todo = todo[lost]
            slot[todo] = (slot[todo] + 1) & int(self._mask)
        table.count += lo.size


def _distinct(lo: np.ndarray) -> bool:
    """Return whether no two ``lo`` hashes are equal (then no two ids are), by one sort."""
    ordered = np.sort(lo)
    return bool((ordered[1:] != ordered[:-1]).all())
