"""A Python client of the skpub daemon (``skpub serve``), synchronous, over httpx.

>>> from skpub.client import Client
>>> with Client("http://127.0.0.1:8750", token="...") as skpub:             # doctest: +SKIP
...     skpub.subscribe("s1", {"kind": "range", "rect": [0, 0, 5, 5], "keywords": ["cafe"]})
...     skpub.publish(['{"type":"object","id":"o1","x":1,"y":1,"terms":["cafe"]}'])
...     for delivery in skpub.follow(after=0):
...         print(delivery)

What it does for its user:

- **publish** splits lines into request bodies of at most ``body_bytes``
  and waits out a full backlog (429: it honours ``Retry-After``);
- **subscribe / unsubscribe** raise :class:`Refused` with the daemon's
  status, SEMANTICS reason code and message (SEMANTICS section 7); a repeated
  identical subscribe is not an error;
- **follow** yields the lines of an output log from an offset on, by long
  poll or Server-Sent Events, and resumes by itself after a restart of the
  daemon or a dropped connection (from the last offset it yielded, which it
  can also keep in a file: ``cursor``). Delivery is at least once across a
  crash of the *client*: a line may come again after it, never skipped.

Transient failures (connection errors, 429, 503 while a daemon restarts)
are retried with exponential backoff and jitter (stamina). The client
imports nothing else of skpub: a consumer installs it with the package and
talks HTTP only.
"""

from __future__ import annotations

import json
import os
import select
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import stamina
from httpx_sse import connect_sse

DEFAULT_URL = "http://127.0.0.1:8750"
BODY_BYTES = 4 << 20
"""Most bytes per ``POST /v1/records`` body (the daemon's default limit is 16 MiB)."""

LOGS = ("deliveries", "dead_letters", "snapshots")

FLUSH = object()
"""Among the lines given to :meth:`Client.publish`: send the lines before it now, in their own body."""


class Refused(Exception):  # noqa: N818 - the daemon's answer, not a client failure
    """The daemon refused a request: its HTTP ``status``, the SEMANTICS ``reason`` (if any) and its ``detail``."""

    def __init__(self, status: int, detail: str, reason: str | None = None, body: dict | None = None) -> None:
        super().__init__(f"{status} {reason + ': ' if reason else ''}{detail}")
        self.status, self.detail, self.reason, self.body = status, detail, reason, body or {}


class _Busy(Exception):  # noqa: N818 - retried, never raised to the caller while attempts remain
    """A transient answer (429, 503): retried after ``wait`` seconds (``Retry-After``) or with backoff."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}: {response.text[:200]}")
        self.response = response
        retry_after = response.headers.get("retry-after", "")
        self.wait = float(retry_after) if retry_after.isdigit() else None


def _backoff(exc: Exception) -> bool | float:
    """Return whether (or after how many seconds) to retry: transport errors and busy answers (Retry-After)."""
    if isinstance(exc, _Busy):
        return exc.wait if exc.wait is not None else True
    return isinstance(exc, httpx.TransportError)


def _unsent(exc: Exception) -> bool | float:
    """Return whether to retry a request that must not be sent twice: only what never reached the daemon."""
    if isinstance(exc, _Busy):  # 429 and 503 append nothing
        return exc.wait if exc.wait is not None else True
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)


class Client:
    """A connection to one daemon.

    Parameters
    ----------
    url : str
        The daemon's base URL (default ``$SKPUB_URL`` or ``http://127.0.0.1:8750``).
    token : str, optional
        The bearer token (default ``$SKPUB_TOKEN``; none: no header).
    timeout : float
        Seconds per request (a long poll adds its wait).
    retry_seconds : float
        Longest time a call keeps retrying transient failures before it raises.
    transport : httpx.BaseTransport, optional
        For tests (an ASGI app in process, say).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        retry_seconds: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        token = token if token is not None else os.environ.get("SKPUB_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        base = url or os.environ.get("SKPUB_URL") or DEFAULT_URL
        self.http = httpx.Client(base_url=base, headers=headers, timeout=timeout, transport=transport)
        self.retry_seconds = retry_seconds

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- requests -----------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, resend: bool = True, **kwargs: Any) -> httpx.Response:
        """Send a request, retrying transient failures; return a 2xx response.

        With ``resend=False`` (a request that appends: sent twice, it would
        append twice) only failures that never reached the daemon are
        retried (no connection, 429, 503); a reply lost after sending raises.

        Raises
        ------
        Refused
            For any other answer (after retries, a 429 or 503 too).
        httpx.TransportError
            If the daemon stays unreachable for ``retry_seconds``, or (``resend=False``) the reply was lost.
        """
        hook = _backoff if resend else _unsent
        try:
            for attempt in stamina.retry_context(on=hook, attempts=None, timeout=self.retry_seconds):
                with attempt:
                    response = self.http.request(method, path, **kwargs)
                    if response.status_code in (429, 503):
                        raise _Busy(response)
        except _Busy as busy:
            response = busy.response
        if response.is_success:
            return response
        try:
            body = response.json()
        except ValueError:
            body = {"detail": response.text[:500]}
        detail = body.get("detail") if isinstance(body, dict) else None
        reason = body.get("reason") if isinstance(body, dict) else None
        raise Refused(response.status_code, str(detail or response.reason_phrase), reason, body)

    def _found(self, path: str) -> dict | None:
        """``GET path`` as JSON, or None when the daemon answers 404 (any other refusal raises :class:`Refused`)."""
        try:
            return self._request("GET", path).json()
        except Refused as refused:
            if refused.status == 404:
                return None
            raise

    def publish(self, lines: Iterable[str | bytes | dict], body_bytes: int = BODY_BYTES) -> dict:
        """Append records (JSON-lines text, bytes, or dicts) to the daemon's ingest log, in order.

        Returns ``{"accepted": n, "first": position, "last": position}``
        over all the bodies sent (positions are ingest positions; null when
        none). Each body is durable when its request returns. A body is sent
        again only when it never reached the daemon, so no line is appended
        twice by a retry. A :data:`FLUSH` among the lines sends the body
        so far at once (a live source: :func:`live_lines` yields one when a
        line has waited ``linger`` seconds).

        Raises
        ------
        Refused
            If a body is refused (413: one line longer than the daemon's limit).
        httpx.TransportError
            If the reply to a body was lost: its lines may or may not be appended (the bodies before were).
        """
        total, first, last = 0, None, None
        for body in _bodies(lines, body_bytes):
            reply = self._request("POST", "/v1/records", resend=False, content=body).json()
            total += reply["accepted"]
            first = reply["first"] if first is None else first
            last = reply["last"] if reply["last"] is not None else last
        return {"accepted": total, "first": first, "last": last}

    def subscribe(self, sid: str, definition: dict) -> dict:
        """Subscribe ``sid`` with ``definition`` (``kind`` and its fields); return the daemon's answer.

        ``{"accepted": 1, ...}`` when appended, ``{"accepted": 0, ...}`` when
        ``sid`` is live with this very definition.

        Raises
        ------
        Refused
            422 with the reason for an invalid definition; 409 for an id live
            with another definition or used before.
        """
        return self._request("PUT", f"/v1/subscriptions/{_quoted(sid)}", json=definition).json()

    def unsubscribe(self, sid: str) -> dict:
        """Unsubscribe ``sid``.

        Raises
        ------
        Refused
            404 ``unknown_id`` when it is not live.
        httpx.TransportError
            If the reply was lost (not resent: a second unsubscribe would be refused).
        """
        return self._request("DELETE", f"/v1/subscriptions/{_quoted(sid)}", resend=False).json()

    def get(self, sid: str) -> dict | None:
        """Return ``{"subscription": record, "result": [...]}`` of live subscription ``sid``, or None."""
        return self._found(f"/v1/subscriptions/{_quoted(sid)}")

    def subscriptions(self, kind: str | None = None, page: int = 1000) -> Iterator[dict]:
        """Yield the live subscriptions' records in id order, ``page`` per request (of ``kind`` only, if given)."""
        after = None
        while True:
            params: dict[str, Any] = {"limit": page}
            if kind is not None:
                params["kind"] = kind
            if after is not None:
                params["after"] = after
            reply = self._request("GET", "/v1/subscriptions", params=params).json()
            yield from reply["subscriptions"]
            after = reply["next"]
            if after is None:
                return

    def snapshot(self, sid: str | None = None) -> dict:
        """Take a snapshot when the stream reaches it; return ``{"id", "position"}`` (an id is made if none).

        Not resent once it reached the daemon (a second one would be a ``duplicate_id`` dead letter).
        """
        body = {"id": sid if sid is not None else uuid.uuid4().hex}
        return self._request("POST", "/v1/snapshots", resend=False, json=body).json()

    def snapshot_lines(self, sid: str) -> list[dict] | None:
        """Return snapshot ``sid``'s lines, or None while it is not taken."""
        found = self._found(f"/v1/snapshots/{_quoted(sid)}")
        return None if found is None else found["lines"]

    # --- delivery targets (SEMANTICS section 7) -------------------------------------------------------------
    def targets(self) -> list[dict]:
        """Return every target's status: definition, cursor, lag, state and last error."""
        return self._request("GET", "/v1/targets").json()["targets"]

    def target(self, name: str) -> dict | None:
        """Return target ``name``'s status, or None when there is no such target."""
        return self._found(f"/v1/targets/{_quoted(name)}")

    def define_target(self, name: str, definition: dict) -> dict:
        """Define (or redefine, keeping its cursor) target ``name``; return its status.

        Safe to resend: the same definition twice is one target.

        Raises
        ------
        Refused
            422 ``bad_target`` with a sentence for a definition that cannot be used.
        """
        return self._request("PUT", f"/v1/targets/{_quoted(name)}", json=definition).json()

    def delete_target(self, name: str) -> bool:
        """Remove target ``name`` and its cursor; return False when there was no such target.

        Raises
        ------
        httpx.TransportError
            If the reply was lost (not resent: a resent delete would answer 404 for a target it removed).
        """
        try:
            self._request("DELETE", f"/v1/targets/{_quoted(name)}", resend=False)
        except Refused as refused:
            if refused.status == 404:
                return False
            raise
        return True

    # --- following a log -----------------------------------------------------------------------------------
    def follow(
        self,
        after: int | None = None,
        log: str = "deliveries",
        subscription: str | None = None,
        cursor: str | Path | None = None,
        sse: bool = False,
        wait: float = 20.0,
        idle_stop: bool = False,
    ) -> Iterator[dict]:
        """Yield the lines of output log ``log`` after offset ``after``, each with its ``offset``, forever.

        Parameters
        ----------
        after : int, optional
            Start after this offset (default: the offset in ``cursor``, else 0).
        log : str
            ``deliveries``, ``dead_letters`` or ``snapshots``.
        subscription : str, optional
            Only this subscription's lines.
        cursor : path, optional
            A file keeping the offset of the last line handled: a line counts
            as handled when the caller asks for the next one, and the file is
            then replaced atomically. A restarted consumer resumes after it,
            so the line it was handling when it stopped comes again (at
            least once).
        sse : bool
            Read the Server-Sent Events stream instead of long polls.
        wait : float
            Seconds a long poll waits for a new line.
        idle_stop : bool
            Stop at the first long poll (or stream) that brings nothing
            (for scripts and tests; needs ``sse=False``).

        A restart of the daemon or a dropped connection is retried with
        backoff from the last offset yielded. Raises :class:`Refused` for a
        410 (the offset is older than retention: ``body["earliest"]``) or a
        416 (past the end: ``body["end"]``).
        """
        if log not in LOGS:
            raise ValueError(f"log is one of {LOGS}, not {log!r}")
        position = after if after is not None else read_cursor(cursor)
        params: dict[str, Any] = {} if subscription is None else {"subscription": subscription}
        while True:
            if sse:
                lines, following = self._events(log, position, params), None
            else:
                lines, following = self._poll(log, position, params, wait)
            got = 0
            for line in lines:
                yield line
                got += 1
                position = line["offset"]
                if cursor is not None:
                    save_cursor(cursor, position)
            if following is not None and following > position:  # a filtered read scanned past others' lines
                position = following
                if cursor is not None:
                    save_cursor(cursor, position)
            elif idle_stop and got == 0:
                return

    def _poll(self, log: str, after: int, params: dict, wait: float) -> tuple[list[dict], int]:
        """One long poll: the lines after ``after`` (none if the wait ends first), and the offset read up to."""
        query = {**params, "after": after, "wait": wait}
        read = self.http.timeout.read
        reply = self._request("GET", f"/v1/{log}", params=query, timeout=None if read is None else read + wait).json()
        return reply[log], reply["next"]

    def _events(self, log: str, after: int, params: dict) -> Iterator[dict]:
        """Yield the Server-Sent Events of ``log`` from ``after`` until the stream ends or the connection drops."""
        try:
            with connect_sse(self.http, "GET", f"/v1/{log}/stream", params={**params, "after": after}) as source:
                if not source.response.is_success:
                    source.response.read()
                    self._request("GET", f"/v1/{log}", params={**params, "after": after})  # raises its refusal
                for event in source.iter_sse():
                    yield json.loads(event.data)
        except httpx.TransportError:  # the daemon went: wait (with backoff) until it answers, then reconnect
            self._request("GET", "/healthz")


def _bodies(lines: Iterable[str | bytes | dict], body_bytes: int) -> Iterator[bytes]:
    """Group ``lines`` into request bodies of at most ``body_bytes`` (a longer line goes alone).

    A :data:`FLUSH` ends the body being filled.
    """
    body: list[bytes] = []
    size = 0
    for line in lines:
        if line is FLUSH:
            if body:
                yield b"".join(body)
                body, size = [], 0
            continue
        raw = json.dumps(line).encode() if isinstance(line, dict) else line.encode() if isinstance(line, str) else line
        raw = raw.rstrip(b"\n") + b"\n"
        if body and size + len(raw) > body_bytes:
            yield b"".join(body)
            body, size = [], 0
        body.append(raw)
        size += len(raw)
    if body:
        yield b"".join(body)


def live_lines(fd: int, linger: float, read_bytes: int = 1 << 16) -> Iterator[bytes | object]:
    r"""Yield the lines read from file descriptor ``fd`` (a pipe or a terminal), with :data:`FLUSH` when due.

    A line is the bytes before a ``\n`` (without it); :data:`FLUSH` follows
    as soon as the oldest line yielded since the last one has waited
    ``linger`` seconds, whether or not more lines are coming, so a steady
    trickle is sent every ``linger`` seconds and a pause does not hold a
    line back. Reads with ``select`` and ``os.read`` in the caller's thread
    (no reader thread: the caller may stop at any line). The bytes after
    the last ``\n`` at the end of input are the last line.
    """
    partial: list[bytes] = []  # the pieces of a line not ended yet (each read is searched once: O(bytes))
    waiting_since = None
    while True:
        timeout = None if waiting_since is None else max(0.0, waiting_since + linger - time.monotonic())
        if not select.select([fd], [], [], timeout)[0]:
            yield FLUSH
            waiting_since = None
            continue
        chunk = os.read(fd, read_bytes)
        if not chunk:
            break
        *ended, rest = chunk.split(b"\n")
        if ended:
            ended[0] = b"".join([*partial, ended[0]])
            partial = []
        if rest:
            partial.append(rest)
        for line in ended:
            yield line
            waiting_since = time.monotonic() if waiting_since is None else waiting_since
        if waiting_since is not None and time.monotonic() >= waiting_since + linger:
            yield FLUSH
            waiting_since = None
    if partial:
        yield b"".join(partial)


def _quoted(sid: str) -> str:
    """Return ``sid`` as one URL path segment."""
    return quote(sid, safe="")


def read_cursor(cursor: str | Path | None) -> int:
    """Return the offset a cursor file holds (0 when there is no file).

    Raises
    ------
    ValueError
        If the file holds something else.
    """
    if cursor is None:
        return 0
    try:
        text = Path(cursor).read_text("ascii", errors="replace").strip()
    except FileNotFoundError:
        return 0
    if not text.isdigit() or len(text) > 20:
        raise ValueError(f"cursor file {cursor} does not hold an offset (a number): {text[:40]!r}")
    return int(text)


def save_cursor(cursor: str | Path, offset: int) -> None:
    """Replace the cursor file's content with ``offset`` atomically (a crash leaves the old or the new).

    Not fsync'd: after a crash of the machine the cursor may be older, and
    lines after it come again (at least once), never skipped.
    """
    path = Path(cursor)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(f"{offset}\n")
    os.replace(tmp.name, path)
