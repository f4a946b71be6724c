"""The subscription endpoints' check before a request is acknowledged (SEMANTICS section 7).

``PUT`` and ``DELETE /v1/subscriptions/{id}`` answer at once whether the
data plane will accept the record they append: an invalid definition, a
subscribe of an id that was ever accepted, an unsubscribe of an id that is
not live, are refused and never reach the ingest log; a subscribe identical
to the live one changes nothing. The record is checked by the data plane's
own parser (:func:`~skpub.kernel.records.parse_line`: the same rules and
reason codes, one implementation), and the ids against what the stream
will hold once every acknowledged line is processed:

- the committed state (:class:`~skpub.app.commits.Base`: the live
  definitions, and the ids accepted and since unsubscribed), as of the
  last batch the data plane committed;
- and :class:`Admission`'s *pending* overlay: the effect of every ingest
  line acknowledged after it, projected in ingest order with the same
  rules as the data plane's sequencer (a valid subscribe of an unknown id
  goes live, a valid unsubscribe of a live id retires it, anything else
  changes nothing). Lines posted to ``/v1/records`` are projected too: a
  line holding neither the bytes ``ubscribe`` nor a backslash cannot be a
  subscribe or an unsubscribe (the type's value would have to be spelled
  with an escape), so only the others are parsed.

An overlay entry is dropped once the data plane has processed its line:
the committed state then says the same. The daemon calls every method
under its ingest lock, so a check and the append it allows are one step.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from skpub.kernel.geometry import Rect
from skpub.kernel.records import DeadLetter, RangeSubscription, Record, Subscription, Unsubscribe, parse_line

LIVE, RETIRED, UNKNOWN = "live", "retired", "unknown"
"""What an id is to the stream: a live subscription's, an unsubscribed one's (never reusable), or neither."""


class Refusal(Exception):  # noqa: N818 - a refusal is an answer, not an error of the daemon
    """Why a subscription request is refused: an HTTP ``status``, a SEMANTICS ``reason`` code and a ``message``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class Standing:
    """What id ``sid`` is now (:data:`LIVE`, :data:`RETIRED` or :data:`UNKNOWN`) and, when live, its record."""

    state: str
    record: Record | None = None


class Admission:
    """The subscription ids as they will be once the data plane has processed every acknowledged line.

    Parameters
    ----------
    space : Rect
        The deployment space (the parser's ``out_of_space`` check).
    max_record_bytes : int
        The parser's ``too_large`` bound.
    committed : callable
        ``committed(sid) -> (state, definition line or None)`` as of the last
        commit: the daemon's :class:`~skpub.app.commits.Base`.
    processed : callable
        ``processed() -> int``: ingest lines the data plane has committed.

    Memory: one entry per id touched by an acknowledged line not yet
    processed (bounded by the daemon's ``max_backlog``): every call first
    drops the entries of processed lines, oldest first.
    """

    def __init__(
        self,
        space: Rect,
        max_record_bytes: int,
        committed: Callable[[str], tuple[str, bytes | None]],
        processed: Callable[[], int],
    ) -> None:
        self.space, self.max_record_bytes = space, max_record_bytes
        self._committed, self._processed = committed, processed
        self._pending: dict[str, tuple[int, Standing]] = {}  # id -> (ingest index of its line, standing after it)
        self._order: deque[tuple[int, str]] = deque()  # (ingest index, id) of the entries, in ingest order

    def standing(self, sid: str) -> Standing:
        """Return what ``sid`` will be once every acknowledged line is processed (O(1) amortized; a parse if live)."""
        self._prune()
        pending = self._pending.get(sid)
        if pending is not None:
            return pending[1]
        state, line = self._committed(sid)
        if state != LIVE or line is None:
            return Standing(state)
        record = parse_line(line, 0, self.space, self.max_record_bytes)
        return Standing(LIVE, None if isinstance(record, DeadLetter) else record)

    def check_subscribe(self, sid: str, line: bytes) -> Record | None:
        """Check the subscribe record ``line`` of id ``sid``; return its record, or None if it changes nothing.

        Raises
        ------
        Refusal
            422 with the parser's reason for an invalid record; 409
            ``duplicate_id`` for a live id with another definition, or an id
            accepted before and since unsubscribed.
        """
        record = parse_line(line, 0, self.space, self.max_record_bytes)
        if isinstance(record, DeadLetter):
            raise Refusal(422, record.reason, record.message)
        standing = self.standing(sid)
        if standing.state == LIVE:
            if standing.record is not None and _same(standing.record, record):
                return None
            raise Refusal(409, "duplicate_id", f"subscription {sid!r} is live with another definition")
        if standing.state == RETIRED:
            raise Refusal(
                409, "duplicate_id", f"subscription id {sid!r} was used before: ids are unique for the whole stream"
            )
        return record

    def check_unsubscribe(self, sid: str) -> None:
        """Check an unsubscribe of ``sid``.

        Raises
        ------
        Refusal
            404 ``unknown_id`` if ``sid`` is not live (or will not be, once
            the acknowledged lines are processed).
        """
        if self.standing(sid).state != LIVE:
            raise Refusal(404, "unknown_id", f"no live subscription {sid!r}")

    def appended(self, lines: list[bytes], first: int) -> None:
        """Project ``lines``, appended to the ingest log at indexes ``first``, ``first + 1``, ..., in that order."""
        for i, line in enumerate(lines):
            if b"ubscribe" not in line and b"\\" not in line:
                continue
            record = parse_line(line, 0, self.space, self.max_record_bytes)
            if isinstance(record, Subscription) and self.standing(record.id).state == UNKNOWN:
                self._note(first + i, record.id, Standing(LIVE, record))
            elif isinstance(record, Unsubscribe) and self.standing(record.id).state == LIVE:
                self._note(first + i, record.id, Standing(RETIRED))

    def __len__(self) -> int:
        """Entries of the pending overlay (ids touched by acknowledged lines not yet processed)."""
        self._prune()
        return len(self._pending)

    def _note(self, index: int, sid: str, standing: Standing) -> None:
        self._pending[sid] = (index, standing)
        self._order.append((index, sid))

    def _prune(self) -> None:
        """Drop the entries whose lines the data plane has processed: the committed state holds them now."""
        processed = self._processed()
        while self._order and self._order[0][0] < processed:
            index, sid = self._order.popleft()
            entry = self._pending.get(sid)
            if entry is not None and entry[0] == index:  # a later line of the same id keeps its own entry
                del self._pending[sid]


def _same(a: Record, b: Record) -> bool:
    """Whether two subscribe records define the same subscription (their stream positions and clause order aside)."""
    return _canonical(a) == _canonical(b)


def _canonical(record: Record) -> Record:
    """Return ``record`` at position 0, a range subscription's clauses as a set (their order changes no match)."""
    clauses = {"dnf": frozenset(record.dnf)} if isinstance(record, RangeSubscription) else {}
    return dataclasses.replace(record, pos=0, **clauses)
