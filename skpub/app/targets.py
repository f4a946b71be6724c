"""Delivery targets: the daemon pushes deliveries where consumers live (SEMANTICS section 7).

A *target* is a named destination with the subscriptions that feed it,
defined by ``PUT /v1/targets/{name}`` and kept in ``DATA/targets/``. Each
has a *cursor*: the offset of the last delivery line it has handled (sent,
or not selected). One thread per target reads the committed delivery log
after its cursor (the log is the backlog: nothing is queued in memory, so a
target that fails costs the data plane and the other targets nothing), sends
the lines its subscriptions select, and only then moves and fsyncs its
cursor. So delivery is at least once (a crash between a send and the cursor
write sends those lines again, with their offsets), and in offset order: a
batch is resent whole until it is taken, never overtaken by a later one.

A target that keeps failing is retried with exponential backoff and jitter
(stamina, at most ``MAX_WAIT_SECONDS`` apart); after ``PAUSE_SECONDS`` of
failures it is *paused* (``state``, the ``skpub_target_paused`` metric and
a log line: an alert's input) and goes on probing; the first success resumes
it from its cursor. A cursor that retention has passed is reported and
counted (``behind_retention``), and the target goes on from the earliest
line kept: never skipped in silence.

Kinds (:mod:`skpub.app.senders`, one sender each): ``webhook`` (an HTTP
POST of ``{"deliveries": [line, ...]}``, each line as ``GET
/v1/deliveries`` gives it, with its ``offset``; signed with the first line
of ``secret_file`` when given), ``mqtt`` (QoS 1 to ``topic``), ``nats``
(JetStream on ``subject``, the offset as ``Nats-Msg-Id``) and ``redis``
(``XADD`` to ``stream`` with the id ``<offset>-0``).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import stamina

from skpub.app.senders import CHANNELS, SCHEMES, SENDERS, Batch
from skpub.kernel.storage import atomic_write_bytes

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
"""A target's name: it names its file in ``DATA/targets/``, so only these characters."""

MAX_BATCH = 10_000
PAUSE_SECONDS = 60.0
"""Seconds of failures after which a target is reported paused."""
MAX_WAIT_SECONDS = 5.0
"""Most seconds between two attempts (a paused target probes this often; a shutdown waits at most this long)."""
LOG = logging.getLogger("skpub.daemon")

POLL_SECONDS = 0.05
"""How often an idle target looks for newly committed deliveries."""
COMMIT_TIMES = 100_000
"""Most commit times kept for ``lag_seconds``; when full they are thinned (:func:`_thinned`)."""
AGE_TOLERANCE = 0.01
"""The share of a line's age by which a thinned list of commit times may under-report it."""


class TargetError(ValueError):
    """A target definition that cannot be used: the sentence says why."""


@dataclass(frozen=True)
class TargetSpec:
    """A target's definition (the body of ``PUT /v1/targets/{name}``).

    ``subscriptions``: ``"*"``, a list of ids, or ``{"prefix": "s"}``;
    ``timeout``: seconds per send; ``batch``: most delivery lines per send.
    """

    name: str
    kind: str
    url: str
    subscriptions: Any = "*"
    secret_file: str | None = None
    timeout: float = 10.0
    batch: int = 500
    topic: str = ""
    """mqtt: the topic template (``{sub}``: the subscription id)."""
    subject: str = ""
    """nats: the subject template."""
    stream: str = ""
    """redis: the stream name template."""

    @classmethod
    def from_json(cls, name: str, doc: Any) -> TargetSpec:
        """Return the definition ``doc`` (a JSON object) of target ``name``.

        Raises
        ------
        TargetError
            With a sentence, for a bad name, kind, URL, selector, secret file, timeout or batch.
        """
        if not NAME.fullmatch(name):
            raise TargetError(
                "a target name has 1 to 64 letters, digits, '_', '.' or '-', starting with one of the first two"
            )
        if not isinstance(doc, dict):
            raise TargetError('a target is a JSON object: {"kind": "webhook", "url": ..., "subscriptions": "*"}')
        kind = doc.get("kind")
        if kind not in SENDERS:
            raise TargetError(f"kind must be one of {sorted(SENDERS)}, got {kind!r}")
        field_name, default = CHANNELS.get(kind, (None, ""))
        known = {"kind", "url", "subscriptions", "secret_file", "timeout", "batch", "name", field_name}
        unknown = set(doc) - known
        if unknown:
            raise TargetError(f"unknown field(s) for a {kind} target: {sorted(unknown)}")
        if doc.get("name", name) != name:
            raise TargetError(f"the body names target {doc['name']!r}, the path {name!r}: one target per request")
        url = doc.get("url")
        schemes = SCHEMES[kind]
        if not isinstance(url, str) or not re.fullmatch(rf"({'|'.join(schemes)})://[^\s/]+(/[^\s]*)?", url):
            raise TargetError(f"a {kind} target's url is a {' or '.join(s + '://' for s in schemes)} URL")
        where = doc.get(field_name, default) if field_name else ""
        if field_name and (not isinstance(where, str) or not 0 < len(where) <= 256 or "\x00" in where):
            raise TargetError(f"{field_name} is a name of 1 to 256 characters ({{sub}}: the subscription id)")
        tokens = where.split(".")
        if kind == "nats" and "{sub}" in where and "{sub}" not in tokens:
            raise TargetError("in a nats subject {sub} is a whole token (a.b.{sub})")
        if kind == "nats" and not re.fullmatch(r"[^\s.*>]+(\.[^\s.*>]+)*", where.replace("{sub}", "x")):
            raise TargetError("a nats subject is dot-separated tokens without spaces, '*' or '>'")
        if kind == "mqtt" and ("+" in where or "#" in where):
            raise TargetError("an mqtt topic to publish to holds no wildcard ('+', '#')")
        selector = doc.get("subscriptions", "*")
        if not _selector_ok(selector):
            raise TargetError('subscriptions is "*", a list of ids, or {"prefix": "..."}')
        secret_file = doc.get("secret_file")
        if secret_file is not None:
            if not isinstance(secret_file, str):
                raise TargetError("secret_file names a readable file holding the signing secret")
            secret_file = str(Path(secret_file).absolute())
            read_secret(secret_file)
        timeout, batch = doc.get("timeout", 10.0), doc.get("batch", 500)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
            raise TargetError("timeout is a number of seconds in (0, 300]")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise TargetError(f"batch is an integer from 1 to {MAX_BATCH}")
        channels = {field_name: where} if field_name else {}
        return cls(name, kind, url, selector, secret_file, float(timeout), batch, **channels)

    def to_json(self) -> dict:
        """Return the definition as the JSON object it was given as (with its name)."""
        doc = {"name": self.name, "kind": self.kind, "url": self.url, "subscriptions": self.subscriptions}
        if self.secret_file is not None:
            doc["secret_file"] = self.secret_file
        if self.kind in CHANNELS:
            field_name = CHANNELS[self.kind][0]
            doc[field_name] = getattr(self, field_name)
        return {**doc, "timeout": self.timeout, "batch": self.batch}

    def writes_same_place(self, other: TargetSpec) -> bool:
        """Whether both are Redis targets writing the same stream (their ids would refuse each other's lines)."""
        return self.kind == other.kind == "redis" and (self.url, self.stream) == (other.url, other.stream)

    def selects(self, sid: str) -> bool:
        """Whether deliveries of subscription ``sid`` go to this target."""
        chosen = self.subscriptions
        if chosen == "*":
            return True
        if isinstance(chosen, dict):
            return sid.startswith(chosen["prefix"])
        return sid in self._ids

    @cached_property
    def _ids(self) -> frozenset[str]:
        return frozenset(self.subscriptions) if isinstance(self.subscriptions, list) else frozenset()


def _thinned(times: list[tuple[int, float]], now: float) -> list[tuple[int, float]]:
    """Return commit times ``(end, when)`` thinned by age: fewer than :data:`COMMIT_TIMES` * 3/4 are kept.

    The first and the last stay; an entry goes when the gap it leaves (from
    the one kept before it to the one after it) is at most
    :data:`AGE_TOLERANCE` times the age, at ``now``, of the one after it,
    the entry a line of the dropped commit is then aged from. So recent
    commits are kept one by one and old ones about one per 1% of their age
    (a few thousand span years), and no age is under-reported by more than
    that share; should too many remain, the tolerance doubles. O(len(times)).
    """
    tolerance = AGE_TOLERANCE
    while True:
        kept = [times[0]]
        for entry, following in zip(times[1:-1], times[2:], strict=True):
            if following[1] - kept[-1][1] > tolerance * (now - following[1]):
                kept.append(entry)
        kept.append(times[-1])
        if len(kept) < COMMIT_TIMES * 3 // 4 or len(kept) <= 2:
            return kept
        tolerance *= 2


def _selector_ok(selector: Any) -> bool:
    if selector == "*":
        return True
    if isinstance(selector, list):
        return all(isinstance(s, str) and s for s in selector) and len(selector) <= 100_000
    return isinstance(selector, dict) and set(selector) == {"prefix"} and isinstance(selector["prefix"], str)


@dataclass
class TargetStatus:
    """What ``GET /v1/targets/{name}`` reports besides the definition."""

    cursor: int
    state: str = "running"
    delivered: int = 0
    failed: int = 0
    behind_retention: int = 0
    last_error: str | None = None
    failing_since: float | None = None
    lag: int = 0


@dataclass
class Target:
    """One target: its definition, its durable cursor, its thread (:class:`Targets` runs it)."""

    spec: TargetSpec
    path: Path
    status: TargetStatus
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held to move the cursor and write the file, and to stop the target: no write after a stop."""

    def save(self) -> None:
        """Write the definition and the cursor atomically and durably."""
        atomic_write_bytes(self.path, orjson.dumps({"spec": self.spec.to_json(), "cursor": self.status.cursor}))

    def halt(self) -> None:
        """Stop the thread; once this returns the thread writes nothing more."""
        with self.lock:
            self.stop.set()

    def advance(self, cursor: int, delivered: int = 0, missed: int = 0) -> bool:
        """Move the cursor to ``cursor`` and write it, unless stopped; return whether it moved."""
        with self.lock:
            if self.stop.is_set():
                return False
            self.status.cursor = cursor
            self.status.delivered += delivered
            self.status.behind_retention += missed
            self.save()
            return True


class Targets:
    """The daemon's targets: their files in ``directory``, their threads, their metrics.

    Parameters
    ----------
    directory : Path
        ``DATA/targets/``: one ``<name>.json`` per target (``{"spec", "cursor"}``).
    read : callable
        ``read(after, limit) -> list of bytes``: committed delivery lines
        after offset ``after`` (raises :class:`~skpub.app.daemon.Gone`).
    committed : callable
        ``committed() -> int``: the offset of the last committed delivery.
    earliest : callable
        ``earliest() -> int``: the offset before the earliest line kept.
    gone : type
        The exception ``read`` raises past retention.
    on_change : callable
        Called with a target's name and status after each change (metrics, logs).

    A target's ``lag`` is the committed delivery lines after its cursor;
    its ``lag_seconds`` is the age of the first of them: seconds since the
    commit that appended it (:meth:`committed_at`; 0 when caught up). Commit
    times are kept in memory, at most :data:`COMMIT_TIMES`: when full they
    are thinned by age (:func:`_thinned`), so an age is under-reported by at
    most :data:`AGE_TOLERANCE` of itself and a target paused for days keeps
    ageing. Lines
    committed before this process started count from its start, so after a
    restart the age is a lower bound until the target has caught up.
    """

    def __init__(
        self,
        directory: Path,
        read: Callable[[int, int], list[bytes]],
        committed: Callable[[], int],
        earliest: Callable[[], int],
        gone: type[Exception],
        on_change: Callable[[str, TargetStatus, str | None], None] = lambda name, status, event: None,
    ) -> None:
        self.directory = Path(directory)
        self._read, self._committed, self._earliest, self._gone = read, committed, earliest, gone
        self._on_change = on_change
        self._lock = threading.Lock()
        self._times_lock = threading.Lock()
        self._commit_times: list[tuple[int, float]] = [(committed(), time.monotonic())]
        self.targets: dict[str, Target] = {}
        self._running = False
        self._instance: str | None = None
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.json")):
                try:
                    doc = orjson.loads(path.read_bytes())
                    spec = TargetSpec.from_json(path.stem, doc["spec"])
                    self.targets[spec.name] = Target(spec, path, TargetStatus(int(doc["cursor"])))
                except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    fields = {"file": str(path), "error": str(exc)}
                    LOG.error("target_unreadable", extra={"fields": fields})  # left as it is, never removed

    @property
    def instance(self) -> str:
        """Return the data directory's id (made at the first send of any target)."""
        if self._instance is None:
            self._instance = _instance_id(self.directory)
        return self._instance

    def start(self) -> None:
        """Start every target's thread."""
        with self._lock:
            self._running = True
            for target in self.targets.values():
                self._start(target)

    def stop(self, seconds: float = 10.0) -> None:
        """Stop every target's thread, waiting at most ``seconds`` in all.

        A thread still in a send then is abandoned (it is a daemon thread,
        and after its stop it writes nothing: its lines are sent again from
        the saved cursor, at least once).
        """
        with self._lock:
            self._running = False
            targets = list(self.targets.values())
        for target in targets:
            target.stop.set()
        deadline = time.monotonic() + seconds
        for target in targets:
            if target.thread is not None:
                target.thread.join(max(0.0, deadline - time.monotonic()))

    def put(self, spec: TargetSpec, after: int | None = None) -> bool:
        """Define or redefine a target; return whether it is new.

        A new target starts after offset ``after`` (default: the last
        committed delivery: it gets what comes next); a redefined one keeps
        its cursor.
        """
        with self._lock:
            old = self.targets.get(spec.name)
            if old is not None and old.spec == spec:
                return False
            for other in self.targets.values():
                if other.spec.name != spec.name and other.spec.writes_same_place(spec):
                    raise TargetError(f"target {other.spec.name!r} writes that {spec.kind} stream already")
            path = self.directory / f"{spec.name}.json"
            if old is not None:
                status = dataclasses.replace(old.status)  # its place and counts go on
            else:
                known = _saved_cursor(path)  # a target file not loaded at start keeps its place
                status = TargetStatus(known if known is not None else self._committed() if after is None else after)
            self.directory.mkdir(parents=True, exist_ok=True)
            target = Target(spec, path, status)
            if old is not None:
                old.halt()
            target.save()
            self.targets[spec.name] = target
            if self._running:
                self._start(target)
            return old is None

    def delete(self, name: str) -> bool:
        """Remove a target and its file; return whether it existed."""
        with self._lock:
            target = self.targets.pop(name, None)
            if target is None:
                return False
            target.halt()
            target.path.unlink(missing_ok=True)
        return True

    def committed_at(self, end: int, when: float | None = None) -> None:
        """Note that delivery lines up to offset ``end`` were committed at ``when`` (``time.monotonic()``)."""
        with self._times_lock:
            times = self._commit_times
            if end <= times[-1][0]:
                return
            now = time.monotonic() if when is None else when
            if len(times) >= COMMIT_TIMES:  # O(COMMIT_TIMES) now and then
                times[:] = _thinned(times, now)
            times.append((end, now))

    def lag_seconds(self, cursor: int, now: float | None = None) -> float:
        """Return the age in seconds of the first committed delivery line after offset ``cursor`` (0: none).

        O(log :data:`COMMIT_TIMES`).
        """
        if cursor >= self._committed():
            return 0.0
        with self._times_lock:
            times = self._commit_times
            at = bisect.bisect_right(times, cursor, key=lambda entry: entry[0])  # the commit holding cursor + 1
            when = times[min(at, len(times) - 1)][1]
        return max(0.0, (time.monotonic() if now is None else now) - when)

    def statuses(self) -> list[dict]:
        """Return every target's definition and status, by name."""
        return [s for name in sorted(self.targets) if (s := self.status(name)) is not None]

    def status(self, name: str) -> dict | None:
        """Return a target's definition and status, or None."""
        target = self.targets.get(name)
        if target is None:
            return None
        s = target.status
        s.lag = max(0, self._committed() - s.cursor)
        return {
            "target": target.spec.to_json(),
            "cursor": s.cursor,
            "lag": s.lag,
            "lag_seconds": round(self.lag_seconds(s.cursor), 3),
            "state": s.state,
            "delivered": s.delivered,
            "failed": s.failed,
            "behind_retention": s.behind_retention,
            "last_error": s.last_error,
        }

    def _start(self, target: Target) -> None:
        target.thread = threading.Thread(target=self._run, args=(target,), name=f"skpub-target-{target.spec.name}")
        target.thread.daemon = True
        target.thread.start()

    # --- one target's thread --------------------------------------------------------------------------------
    def _run(self, target: Target) -> None:
        """Follow the delivery log after the target's cursor until stopped; every failure is counted and retried."""
        sender: list = [None]  # opened lazily, dropped after a failure and opened again
        try:
            while not target.stop.is_set():
                try:
                    self._step(target, sender)
                except Exception as exc:  # noqa: BLE001 - a disk error, a secret gone: counted, retried, never silent
                    _close(sender)
                    self._failed(target, f"{type(exc).__name__}: {exc}")
                    target.stop.wait(MAX_WAIT_SECONDS)
        finally:
            _close(sender)

    def _step(self, target: Target, sender: list) -> None:
        """Send the next batch of lines after the cursor (or wait a little when there is none)."""
        spec = target.spec
        cursor = target.status.cursor
        if cursor >= self._committed():
            target.stop.wait(POLL_SECONDS)
            return
        try:
            lines = self._read(cursor, spec.batch)
        except self._gone:
            earliest = self._earliest()
            if target.advance(earliest, missed=earliest - cursor):
                self._on_change(spec.name, target.status, "behind_retention")
            return
        if not lines:
            target.stop.wait(POLL_SECONDS)
            return
        batch = []
        for line in lines:
            doc = orjson.loads(line)
            if spec.selects(doc["sub"]):
                batch.append((doc["offset"], doc["sub"], line))
        if batch and not self._send(target, sender, batch):
            return  # stopped: the cursor stays; the next start sends these lines again
        if target.advance(cursor + len(lines), delivered=len(batch)):
            self._on_change(spec.name, target.status, None)

    def _send(self, target: Target, sender: list, batch: Batch) -> bool:
        """Send ``batch`` until the target takes it; return False if stopped first."""
        spec, status = target.spec, target.status
        for attempt in stamina.retry_context(
            on=_Failed, attempts=None, timeout=None, wait_initial=0.2, wait_max=MAX_WAIT_SECONDS
        ):
            with attempt:
                if target.stop.is_set():
                    return False
                try:
                    if sender[0] is None:
                        secret = read_secret(spec.secret_file) if spec.secret_file else None
                        sender[0] = SENDERS[spec.kind](spec, secret, self.instance)
                    sender[0].send(batch)
                except Exception as exc:  # noqa: BLE001 - whatever a client library raises is a failed send
                    self._failed(target, str(exc) or type(exc).__name__)
                    _close(sender)
                    raise _Failed(str(exc)) from None
        if status.state != "running" or status.failing_since is not None:
            status.state, status.failing_since = "running", None
            self._on_change(spec.name, status, "resumed")
        return True

    def _failed(self, target: Target, error: str) -> None:
        status = target.status
        status.failed += 1
        status.last_error = error[:500]
        now = time.monotonic()
        if status.failing_since is None:
            status.failing_since = now
        event = None
        if status.state == "running" and now - status.failing_since >= PAUSE_SECONDS:
            status.state, event = "paused", "paused"
        self._on_change(target.spec.name, status, event)


def read_secret(path: str) -> bytes:
    """Return the signing secret: the first line of file ``path``.

    Raises
    ------
    TargetError
        If the file cannot be read or its first line is empty.
    """
    try:
        with open(path, "rb") as fh:
            first = fh.read(4096).splitlines()[:1]
    except OSError as exc:
        raise TargetError(f"secret_file {path} cannot be read: {exc.strerror or exc}") from None
    if not first or not first[0].strip():
        raise TargetError(f"secret_file {path} holds no secret on its first line")
    return first[0].strip()


def _instance_id(directory: Path) -> str:
    """Return this data directory's id (``instance``, made once): it tells its messages from another daemon's."""
    path = directory / "instance"
    try:
        return path.read_text("ascii").strip()[:32]
    except (OSError, UnicodeDecodeError):
        pass
    directory.mkdir(parents=True, exist_ok=True)
    ident = uuid.uuid4().hex[:12]
    atomic_write_bytes(path, ident.encode())
    return ident


def _saved_cursor(path: Path) -> int | None:
    """Return the cursor a target file holds, or None (no file, or one that cannot be read)."""
    try:
        return int(orjson.loads(path.read_bytes())["cursor"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _close(sender: list) -> None:
    """Close the sender held in ``sender[0]`` (if any), ignoring its errors, and forget it."""
    if sender[0] is not None:
        try:
            sender[0].close()
        except Exception:  # noqa: BLE001, S110 - a broken connection is being dropped anyway
            pass
        sender[0] = None


class _Failed(Exception):  # noqa: N818 - retried by stamina, never raised to a caller
    """A send the target did not take."""
