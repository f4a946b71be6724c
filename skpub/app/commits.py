"""The daemon's commit log: one :class:`Commit` per micro-batch whose outputs are in the logs, and its base.

The commit log (``commits-<first>.log``, a
:class:`~skpub.app.journal.SegmentedLog` whose entry ``b`` is batch ``b``'s
commit) says what a client may read: each output log's entries after the
batch, the live subscriptions' definitions, the snapshots by id. Read whole
it grows with the stream, so the daemon *compacts* it: a :class:`Base`
(``commits-<batch>.base``) holds what the commits up to ``batch`` add up to
(the last one's totals, every live definition, every snapshot taken),
written atomically; the commit log's segments before it are then released
and a restart reads the newest base and the commits after it only
(DESIGN "The daemon").
"""

from __future__ import annotations

import re
import sys
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from sortedcontainers import SortedDict

from skpub.kernel.errors import CheckpointError
from skpub.kernel.records import position_index
from skpub.kernel.storage import atomic_write_bytes

LOGS = ("deliveries", "dead_letters", "snapshots")
"""The output logs a client reads, by the name of their route."""

BASE_FORMAT = 2
"""Version 2 adds the retired subscription ids; a version 1 base (an earlier skpub's) is read as having none."""
BASE_HEADERS = (b'{"skpub_commit_base":1,', b'{"skpub_commit_base":2,')
"""How every base skpub writes starts (:meth:`Base.lines`' first line), by version."""
BASE_NAME = re.compile(r"commits-(\d{12}|[1-9]\d{12,})\.base", re.ASCII)


@dataclass(frozen=True)
class Commit:
    """One entry of the commit log: micro-batch ``batch`` committed its outputs.

    ``end``: the ingest index after its last record; ``totals``: each
    output log's entries after it; ``controls``: its accepted controls as
    ``(type, id, at, count)``: a subscribe's ingest index (``at``), an
    unsubscribe, or a snapshot's first entry in the snapshot log and its
    line count; ``definitions``: each accepted subscribe's record line by
    id, so that the ingest log need not keep it (an earlier skpub's commits
    have none).
    """

    batch: int
    end: int
    totals: dict[str, int]
    controls: list[tuple[str, str, int, int]] = field(default_factory=list)
    definitions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        """Encode as one JSON line."""
        return orjson.dumps(
            {
                "batch": self.batch,
                "end": self.end,
                "totals": self.totals,
                "controls": [list(c) for c in self.controls],
                "definitions": self.definitions,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Commit:
        """Decode :meth:`to_json` output.

        Raises
        ------
        CheckpointError
            If ``raw`` is not such an entry.
        """
        try:
            doc = orjson.loads(raw)
            totals = {name: int(doc["totals"][name]) for name in LOGS}
            controls = [(str(k), str(i), int(a), int(c)) for k, i, a, c in doc["controls"]]
            definitions = {str(sid): str(line) for sid, line in doc.get("definitions", {}).items()}
            return cls(int(doc["batch"]), int(doc["end"]), totals, controls, definitions)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"damaged commit log entry: {exc}") from None


def commit_controls(
    accepted: list[tuple[int, str, str]], start: int, first_snapshot: int, snapshot_lines: list[dict]
) -> list[tuple[str, str, int, int]]:
    """Return a batch's commit-log controls from its accepted ``(position, type, id)`` records.

    ``start`` is the batch's first ingest index; ``first_snapshot`` the
    snapshot log's entries before the batch, ``snapshot_lines`` its snapshot
    lines in order.
    """
    count = Tally(line["snapshot"] for line in snapshot_lines)
    starts: dict[str, int] = {}
    for j, line in enumerate(snapshot_lines):
        starts.setdefault(line["snapshot"], first_snapshot + j)
    out = []
    for pos, kind, sid in accepted:
        if kind == "subscribe":
            out.append((kind, sid, start + position_index(pos), 0))
        elif kind == "unsubscribe":
            out.append((kind, sid, 0, 0))
        else:
            out.append((kind, sid, starts.get(sid, first_snapshot), count.get(sid, 0)))
    return out


@dataclass
class Base:
    """What the commit log's entries up to ``commit.batch`` add up to (module docstring).

    ``definitions``: live subscription id -> its accepted subscribe record's
    line, in id order (``GET /v1/subscriptions`` pages through it);
    ``retired``: the ids of subscriptions accepted and since unsubscribed
    (never reusable, SEMANTICS section 1; a data directory of an earlier
    skpub knows only those retired after its last version 1 base);
    ``snapshots``: taken snapshot id -> (first entry, entries) of its lines
    in the snapshot log.
    """

    commit: Commit
    definitions: SortedDict = field(default_factory=SortedDict)
    snapshots: dict[str, tuple[int, int]] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)

    def account(self, commit: Commit, ingest_line: Callable[[int], bytes]) -> bool:
        """Add the next commit's accepted controls; return whether a definition was read from the ingest log.

        ``ingest_line(index)`` gives an ingest line, for the commits of an
        earlier skpub, whose subscribe controls carry no line.
        """
        legacy = False
        for kind, sid, at, count in commit.controls:
            if kind == "subscribe" and sid in commit.definitions:
                self.definitions[sid] = commit.definitions[sid].encode()
            elif kind == "subscribe":
                legacy = True
                self.definitions[sid] = ingest_line(at)
            elif kind == "unsubscribe":
                self.definitions.pop(sid, None)
                self.retired.add(sid)
            else:
                self.snapshots[sid] = (at, count)
        self.commit = commit
        return legacy

    def lines(self) -> Iterator[bytes]:
        """Yield the base as JSON lines: a header with the commit, then one line per definition and snapshot."""
        commit = Commit(self.commit.batch, self.commit.end, self.commit.totals)
        yield orjson.dumps({"skpub_commit_base": BASE_FORMAT, "commit": orjson.loads(commit.to_json())})
        for sid, line in self.definitions.items():
            yield orjson.dumps({"subscribe": sid, "line": line.decode("utf-8", "replace")})
        for sid in self.retired:
            yield orjson.dumps({"retired": sid})
        for sid, (first, count) in self.snapshots.items():
            yield orjson.dumps({"snapshot": sid, "first": first, "count": count})

    @classmethod
    def from_lines(cls, lines: Iterator[bytes]) -> Base:
        """Decode :meth:`lines` output.

        Raises
        ------
        CheckpointError
            If it is not a base skpub wrote, or is damaged.
        """
        try:
            header = orjson.loads(next(lines))
            if header.get("skpub_commit_base") not in (1, BASE_FORMAT):
                raise CheckpointError("not a commit log base of this skpub")
            base = cls(Commit.from_json(orjson.dumps(header["commit"])))
            for raw in lines:
                doc = orjson.loads(raw)
                if "subscribe" in doc:
                    base.definitions[str(doc["subscribe"])] = str(doc["line"]).encode()
                elif "retired" in doc:
                    base.retired.add(str(doc["retired"]))
                else:
                    base.snapshots[str(doc["snapshot"])] = (int(doc["first"]), int(doc["count"]))
            return base
        except (StopIteration, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"damaged commit log base: {exc}") from None


def write_base(directory: Path, base: Base) -> Path:
    """Write ``base`` as ``commits-<batch>.base`` atomically and durably; remove older bases; return its path.

    O(definitions + snapshots) time and bytes.
    """
    path = Path(directory) / f"commits-{base.commit.batch:012d}.base"
    atomic_write_bytes(path, b"".join(line + b"\n" for line in base.lines()))
    for batch, older in bases(directory).items():
        if batch < base.commit.batch and _is_base(older):
            older.unlink(missing_ok=True)
    return path


def _is_base(path: Path) -> bool:
    """Return whether ``path`` starts as a base skpub writes (a file of another origin is never removed)."""
    try:
        with path.open("rb") as fh:
            return fh.read(len(BASE_HEADERS[0])) in BASE_HEADERS
    except OSError:
        return False


def bases(directory: Path) -> dict[int, Path]:
    """Return the commit log bases in ``directory`` by batch (skpub's names only)."""
    return {int(m.group(1)): p for p in Path(directory).iterdir() if (m := BASE_NAME.fullmatch(p.name)) and p.is_file()}


def read_base(directory: Path) -> Base | None:
    """Return the newest readable base in ``directory``, or None.

    Only the newest base is normally kept (:func:`write_base` removes the
    older once it is durable); one left by a crash between the two, or an
    unreadable newest, is reported and the next older tried.
    """
    for batch, path in sorted(bases(directory).items(), reverse=True):
        try:
            with path.open("rb") as fh:
                base = Base.from_lines(line.rstrip(b"\n") for line in fh)
        except (CheckpointError, OSError) as exc:
            print(f"[skpub] {path}: {exc}; trying an older base", file=sys.stderr, flush=True)
            continue
        if base.commit.batch == batch:
            return base
    return None
