"""The daemon's HTTP API (``/v1``), built with FastAPI; its OpenAPI document is generated from this code.

Routes (DESIGN "The daemon"): ``POST /v1/records`` (JSON lines, acknowledged
once fsync'd), ``PUT``/``DELETE /v1/subscriptions/{id}`` (checked before
they are acknowledged: :mod:`skpub.app.admission`), ``GET
/v1/subscriptions[/{id}]``, ``GET /v1/deliveries``, ``GET
/v1/dead_letters`` and ``GET /v1/snapshots`` (long-polled reads by offset,
and their ``/stream`` as Server-Sent Events), ``POST /v1/snapshots``,
``GET /healthz``, ``GET /readyz``, ``GET /metrics``, ``GET
/v1/openapi.json`` and ``GET /docs``. Bodies are the typed models of
:mod:`skpub.app.schemas`, which generate the document; every refusal is
listed there with its status.

Security: every route but ``/healthz`` wants ``Authorization: Bearer
<token>`` when the daemon has a token, compared in constant time
(:func:`hmac.compare_digest`); a missing and a wrong token get different
messages. Nothing a client sends becomes a path or code: ids are bounded
strings that only ever go inside a JSON record.
"""

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Literal

import anyio
import orjson
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import TypeAdapter
from starlette.requests import ClientDisconnect

from skpub.app.admission import Refusal
from skpub.app.daemon import LOG, BacklogFull, Daemon, Gone
from skpub.app.schemas import (
    PAGES,
    Accepted,
    Definition,
    Deleted,
    GoneBody,
    Health,
    OutOfRange,
    Readiness,
    Refused,
    SnapshotBody,
    SnapshotTaken,
    SubscriptionPage,
    SubscriptionView,
    TargetList,
    TargetView,
    problems,
)
from skpub.app.targets import TargetError, TargetSpec
from skpub.kernel.decode import LineRejected, decode_line
from skpub.kernel.inputs import BOM

POLL_SECONDS = 0.02
"""How often a long poll or a stream looks for new entries."""
BODY_SECONDS = 60.0
"""The longest a request body may take to arrive, seconds; then 408 (a client that stops sending holds no
connection for ever)."""

HEARTBEAT_SECONDS = 15.0
"""Most seconds a stream stays silent: then it sends an SSE comment."""


DEFINITION = TypeAdapter(Definition).json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
"""The subscribe body's JSON schema: documentation only (the data plane's parser decides, SEMANTICS section 7)."""
DEFINITION_MODELS = DEFINITION.pop("$defs")

TARGET = {
    "type": "object",
    "required": ["kind", "url"],
    "properties": {
        "kind": {"enum": ["webhook", "mqtt", "nats", "redis"]},
        "url": {"type": "string", "format": "uri", "description": "http(s)://, mqtt://, nats:// or redis://"},
        "topic": {"type": "string", "description": "mqtt: topic template, {sub} the subscription id"},
        "subject": {"type": "string", "description": "nats: subject template"},
        "stream": {"type": "string", "description": "redis: stream name template"},
        "subscriptions": {
            "oneOf": [
                {"const": "*"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "object", "properties": {"prefix": {"type": "string"}}, "required": ["prefix"]},
            ]
        },
        "secret_file": {"type": "string"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 300},
        "batch": {"type": "integer", "minimum": 1, "maximum": 10000},
    },
}
"""A target definition's JSON schema: documentation only (:meth:`TargetSpec.from_json` decides)."""

SNAPSHOT_REQUEST = {"type": "object", "properties": {"id": {"type": "string"}}, "description": "Or no body"}

bearer = HTTPBearer(auto_error=False, description="The daemon's token (``--token-file`` or ``$SKPUB_TOKEN``)")
"""The security scheme in the OpenAPI document; :func:`create_app` checks the header itself."""


def create_app(daemon: Daemon, token: str | None) -> FastAPI:
    """Return the API of ``daemon``; with ``token``, every route but ``/healthz`` requires it."""
    limits = daemon.limits
    app = FastAPI(
        title="skpub",
        version="1",
        description="Spatial-keyword publish/subscribe routing daemon",
        openapi_url="/v1/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    expected = f"Bearer {token}".encode() if token else None
    generate = app.openapi

    def openapi() -> dict:
        """Return the generated document with the subscribe body's models among its components."""
        document = generate()
        document.setdefault("components", {}).setdefault("schemas", {}).update(DEFINITION_MODELS)
        return document

    app.openapi = openapi

    def authorized(request: Request, _scheme: Annotated[object, Depends(bearer)] = None) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization")
        if given is None:
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.encode("utf-8", "replace"), expected):
            raise HTTPException(
                401, "the bearer token is wrong", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )

    guarded = [Depends(authorized)]
    writes = problems(401, 408, 413, 429, 503, 507)
    served = daemon.served

    @app.exception_handler(Refusal)
    async def refused(request: Request, exc: Refusal) -> JSONResponse:
        """Answer a refused subscription request: its status, the SEMANTICS reason code and a message."""
        request.state.reason = exc.reason
        return JSONResponse({"detail": exc.message, "reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(OffsetOutOfRange)
    async def out_of_range(_request: Request, exc: OffsetOutOfRange) -> JSONResponse:
        """Answer a read past the end: 416 with the offset of the last committed entry (``end``)."""
        return JSONResponse({"detail": str(exc), "end": exc.end}, status_code=416)

    @app.exception_handler(Gone)
    async def gone(_request: Request, exc: Gone) -> JSONResponse:
        """Answer a read from an offset older than retention: 410 with the earliest offset kept."""
        return JSONResponse({"detail": str(exc), "earliest": exc.earliest + 1}, status_code=410)

    @app.middleware("http")
    async def measure(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's middleware protocol
        start = time.monotonic()
        response = await call_next(request)
        route = request.scope.get("route")
        path = route.path if route is not None else "other"
        status = response.status_code
        served.requests.labels(route=path, method=request.method, status=str(status)).inc()
        served.request_seconds.labels(route=path).observe(time.monotonic() - start)
        if status >= 400:  # one structured line per refused request
            fields = {"method": request.method, "route": path, "status": status}
            fields["reason"] = getattr(request.state, "reason", None)
            LOG.warning("refused", extra={"fields": fields})
        return response

    def accept(post: Callable[[], tuple[int, int] | None]) -> JSONResponse:
        """Append lines with ``post()``; 202, or 200 if nothing changes (429 when the backlog has no room for them).

        A subscription request is checked before the backlog's room is: a
        refusal or an identical subscribe is answered even when it is full.
        """
        if daemon.stopping.is_set():
            raise HTTPException(503, "the daemon is shutting down")
        if daemon.failure is not None:
            raise HTTPException(503, f"the data plane stopped: {daemon.failure!r}")
        try:
            positions = post()
        except BacklogFull as exc:
            raise HTTPException(429, str(exc), headers={"Retry-After": "1"}) from None
        except OSError as exc:
            raise HTTPException(507, f"the ingest log refused the write: {exc.strerror}") from None
        if positions is None:
            return JSONResponse({"accepted": 0, "first": None, "last": None}, status_code=200)
        first, end = positions
        some = end > first
        body = {"accepted": end - first, "first": first if some else None, "last": end - 1 if some else None}
        return JSONResponse(body, status_code=202)

    @app.post(
        "/v1/records",
        dependencies=guarded,
        status_code=202,
        response_model=Accepted,
        responses=writes,
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
        },
    )
    async def post_records(request: Request) -> JSONResponse:
        """Append JSON lines (SEMANTICS 2 records) to the ingest log; reply once they are durable.

        Every line gets a position; an invalid one becomes a dead letter.
        413 past the body limit, 429 with Retry-After when the backlog is
        full, 503 while shutting down.
        """
        lines = split_lines(await read_body(request))
        return accept(lambda: daemon.post(lines))

    @app.put(
        "/v1/subscriptions/{sid}",
        dependencies=guarded,
        status_code=202,
        response_model=Accepted,
        responses={
            **writes,
            200: {"model": Accepted, "description": "Identical to the live definition: nothing appended"},
            400: {"model": Refused, "description": "The body is not a JSON object (malformed_json)"},
            409: {"model": Refused, "description": "The id is live with another definition, or was used before"},
            422: {"model": Refused, "description": "An invalid definition, with its SEMANTICS reason"},
        },
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": DEFINITION}}}},
    )
    async def put_subscription(sid: str, request: Request) -> JSONResponse:
        """Subscribe ``sid``: the body is the subscribe record's fields (``kind``, ``rect``, ``keywords``, ...).

        Checked before it is acknowledged (SEMANTICS section 7): 202 with its
        position; 200 and nothing appended when ``sid`` is live with this very
        definition (a retried request); 400 if the body is not a JSON object;
        422 with the SEMANTICS ``reason`` for an invalid definition; 409
        ``duplicate_id`` for an id live with another definition or used
        before.
        """
        check_id(sid)
        raw = await read_body(request)
        try:  # the rules of a line (SEMANTICS 1): repeated keys, nesting, surrogates, non-finite numbers
            fields = decode_line(raw, daemon.deployment.max_record_bytes)
        except LineRejected as exc:
            raise Refusal(400 if exc.reason == "malformed_json" else 422, exc.reason, exc.message) from None
        if not isinstance(fields, dict):
            raise Refusal(400, "malformed_json", "the body is a JSON object of the subscribe record's fields")
        if fields.pop("type", "subscribe") != "subscribe":
            raise Refusal(422, "wrong_field", 'the body\'s "type", if given, is "subscribe"')
        if fields.pop("id", sid) != sid:
            raise Refusal(422, "wrong_field", 'the body\'s "id", if given, is the id in the path')
        # json, not orjson: a decoded line may hold integers beyond 64 bits (floats are written as they were read)
        line = json.dumps({"type": "subscribe", "id": sid, **fields}, ensure_ascii=False).encode()
        return accept(lambda: daemon.post_subscribe(sid, line))

    @app.get(
        "/v1/subscriptions/{sid}",
        dependencies=guarded,
        response_model=SubscriptionView,
        response_model_exclude_none=True,
        responses=problems(400, 401, 404),
    )
    def get_subscription(sid: str) -> Response:
        """Return a live subscription's definition and, for topk and knn, its current result; 404 if not live.

        ``{"subscription": record, "result": [[object id, score or dist], ...]}``
        (no ``result`` for a range subscription); as of the last batch the
        data plane committed.
        """
        check_id(sid)
        line = daemon.definition(sid)
        if line is None:
            raise HTTPException(404, f"no live subscription {sid!r} (yet)")
        ranked = orjson.loads(line).get("kind") in ("topk", "knn")
        tail = b',"result":%s' % orjson.dumps(daemon.result(sid) or []) if ranked else b""
        return Response(b'{"subscription":%s%s}' % (line, tail), media_type="application/json")

    @app.get("/v1/subscriptions", dependencies=guarded, response_model=SubscriptionPage, responses=problems(401))
    async def list_subscriptions(
        after: Annotated[str | None, Query(min_length=1, max_length=limits.max_id)] = None,
        limit: Annotated[int, Query(ge=1, le=limits.max_limit)] = 100,
        kind: Annotated[Literal["range", "topk", "knn"] | None, Query()] = None,
    ) -> Response:
        """List the live subscriptions in id order, ``limit`` at a time (of ``kind`` only, if given).

        ``{"subscriptions": [record, ...], "next": id}``: pass ``next`` as
        ``after`` for the next page; ``next`` is null at the end. As of the
        last batch the data plane committed.
        """
        scan = limit * 16
        lines, following = await anyio.to_thread.run_sync(daemon.definitions_after, after, limit, kind, scan)
        body = b'{"subscriptions":[%s],"next":%s}' % (b",".join(lines), orjson.dumps(following))
        return Response(body, media_type="application/json")

    @app.delete(
        "/v1/subscriptions/{sid}",
        dependencies=guarded,
        status_code=202,
        response_model=Accepted,
        responses={**writes, **problems(400), 404: {"model": Refused, "description": "Not live (unknown_id)"}},
    )
    def delete_subscription(sid: str) -> JSONResponse:
        """Unsubscribe ``sid``: 202 with its position, or 404 ``unknown_id`` when it is not live (nor will be)."""
        check_id(sid)
        return accept(lambda: daemon.post_unsubscribe(sid))

    async def read_body(request: Request) -> bytes:
        """Return the request's body; 413 as soon as it passes ``max_body_bytes`` (it is never held whole).

        413 at once when the declared ``Content-Length`` is over the limit; 408
        when the body takes more than ``BODY_SECONDS`` to arrive; 400 when the
        client goes away before its end (nothing of it is appended).
        """
        close = {"Connection": "close"}  # the rest of the body is not read: the connection is not kept
        too_large = HTTPException(413, f"the body is over {limits.max_body_bytes} bytes", headers=close)
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and (len(declared) > 20 or int(declared) > limits.max_body_bytes):
            raise too_large
        body = bytearray()
        try:
            async with asyncio.timeout(BODY_SECONDS):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > limits.max_body_bytes:
                        raise too_large
        except TimeoutError:
            raise HTTPException(408, f"the body took more than {BODY_SECONDS:g} s to arrive", headers=close) from None
        except ClientDisconnect:
            raise HTTPException(400, "the client went away before the end of its body", headers=close) from None
        return bytes(body)

    def check_id(sid: str) -> None:
        if not sid or len(sid) > limits.max_id:
            raise Refusal(400, "wrong_field", f"an id has 1 to {limits.max_id} characters")

    async def arrived(name: str, after: int, wait: float) -> None:
        """Wait up to ``wait`` seconds for an entry past ``after`` (polled: a long poll holds no thread)."""
        deadline = time.monotonic() + min(wait, limits.max_wait)
        while daemon.committed(name) <= after and time.monotonic() < deadline and not daemon.stopping.is_set():
            await asyncio.sleep(POLL_SECONDS)

    def entries_after(name: str, after: int, limit: int, subscription: str | None) -> tuple[list[bytes], int]:
        """Return up to ``limit`` entries past offset ``after`` (of ``subscription`` only, if given), and ``next``."""
        if subscription is None:
            entries = daemon.read_committed(name, after, limit)
            return entries, after + len(entries)
        needle = b'"sub":' + orjson.dumps(subscription)
        entries, scanned = [], 0
        for line in daemon.read_committed(name, after, limit * 16):  # a bounded stretch, its matches
            scanned += 1
            if needle in line:
                entries.append(line)
                if len(entries) == limit:
                    break
        return entries, after + scanned

    def beyond_end(name: str, after: int) -> None:
        """Refuse an offset past the last committed entry: 416 with the current ``end`` (Kafka's OFFSET_OUT_OF_RANGE).

        Offsets are never reused, so a consumer holding one the log has not
        reached has the wrong log or a wrong offset, and would otherwise wait
        in silence for entries that come under other offsets.
        """
        end = daemon.committed(name)
        if after > end:
            raise OffsetOutOfRange(name, end)

    def reader(name: str):  # noqa: ANN202 - a route factory
        async def route(
            after: Annotated[int, Query(ge=0, le=2**62)] = 0,
            limit: Annotated[int, Query(ge=1, le=limits.max_limit)] = 1000,
            wait: Annotated[float, Query(ge=0, le=limits.max_wait, allow_inf_nan=False)] = 0.0,
            subscription: Annotated[str | None, Query(max_length=limits.max_id)] = None,
        ) -> Response:
            beyond_end(name, after)
            await arrived(name, after, wait)
            entries, following = await anyio.to_thread.run_sync(entries_after, name, after, limit, subscription)
            body = b'{"%s":[%s],"next":%d}' % (name.encode(), b",".join(entries), following)
            return Response(body, media_type="application/json")

        route.__doc__ = (
            f"{name.replace('_', ' ').capitalize()} after offset ``after`` in commit order, each with its ``offset``;"
            " long-polls up to ``wait`` seconds; ``next`` is the offset to pass as ``after`` next."
        )
        return route

    def streamer(name: str):  # noqa: ANN202 - a route factory
        async def route(
            request: Request,
            after: Annotated[int, Query(ge=0, le=2**62)] = 0,
            subscription: Annotated[str | None, Query(max_length=limits.max_id)] = None,
            last_event_id: Annotated[str | None, Header(max_length=20)] = None,
        ) -> StreamingResponse:
            start = after
            if last_event_id is not None:
                if not last_event_id.isdigit():
                    raise HTTPException(400, "Last-Event-ID is the last offset received")
                start = int(last_event_id)
            if start < daemon.earliest(name):
                raise Gone(name, daemon.earliest(name))
            beyond_end(name, start)

            async def events():  # noqa: ANN202 - an async generator
                position = start
                while not daemon.stopping.is_set() and not await request.is_disconnected():
                    try:
                        entries, following = await anyio.to_thread.run_sync(
                            entries_after, name, position, limits.max_limit, subscription
                        )
                    except Gone:  # retention passed a slow reader: it reconnects and gets 410
                        return
                    for line in entries:
                        yield b"id: %d\ndata: %s\n\n" % (orjson.loads(line)["offset"], line)
                    if following == position:
                        await arrived(name, position, HEARTBEAT_SECONDS)
                        if daemon.committed(name) <= position:
                            yield b": keep-alive\n\n"
                    position = following

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        route.__doc__ = (
            f"{name.replace('_', ' ').capitalize()} as Server-Sent Events from offset ``after`` (or the"
            " ``Last-Event-ID`` header): ``id:`` is the offset, ``data:`` the line; a comment after"
            f" {HEARTBEAT_SECONDS:.0f} quiet seconds keeps the connection alive."
        )
        return route

    reads = {
        **problems(401),
        410: {"model": GoneBody, "description": "Older than retention"},
        416: {"model": OutOfRange, "description": "Past the end"},
    }
    for name in ("deliveries", "dead_letters", "snapshots"):
        app.get(
            f"/v1/{name}/stream",
            dependencies=guarded,
            name=f"{name}_stream",
            response_class=StreamingResponse,
            responses={
                **reads,
                **problems(400),
                200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": "Events"},
            },
        )(streamer(name))
        app.get(f"/v1/{name}", dependencies=guarded, name=name, response_model=PAGES[name], responses=reads)(
            reader(name)
        )

    @app.post(
        "/v1/snapshots",
        dependencies=guarded,
        status_code=202,
        response_model=SnapshotTaken,
        responses={**writes, **problems(400)},
        openapi_extra={"requestBody": {"content": {"application/json": {"schema": SNAPSHOT_REQUEST}}}},
    )
    async def post_snapshot(request: Request) -> JSONResponse:
        """Take a snapshot (SEMANTICS 5) when the stream reaches it: the body ``{"id": ...}`` or none (an id is made).

        Replies 202 with the id and the record's position; read it with
        ``GET /v1/snapshots/{id}``.
        """
        raw = await read_body(request)
        try:
            fields = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise HTTPException(400, f"the body is not JSON: {exc}") from None
        if not isinstance(fields, dict):
            raise HTTPException(400, 'the body is {"id": ...} or empty')
        sid = fields.get("id", uuid.uuid4().hex)
        if not isinstance(sid, str):
            raise HTTPException(400, "a snapshot id is a string")
        check_id(sid)
        line = orjson.dumps({"type": "snapshot", "id": sid})
        reply = accept(lambda: daemon.post([line]))
        return JSONResponse({"id": sid, "position": orjson.loads(reply.body)["first"]}, status_code=202)

    @app.get(
        "/v1/snapshots/{sid}", dependencies=guarded, response_model=SnapshotBody, responses=problems(400, 401, 404)
    )
    async def get_snapshot(sid: str) -> Response:
        """Return the snapshot's lines (an empty list when no topk/knn subscription was active); 404 until taken.

        A snapshot record that became a dead letter (a duplicate id, say) is
        never taken: ``GET /v1/dead_letters`` says why.
        """
        check_id(sid)
        taken = daemon.snapshots.get(sid)
        if taken is None:
            raise HTTPException(404, f"snapshot {sid!r} is not taken (yet)")
        first, count = taken
        lines = await anyio.to_thread.run_sync(daemon.read_committed, "snapshots", first, count)
        return Response(b'{"lines":[%s]}' % b",".join(lines), media_type="application/json")

    @app.put(
        "/v1/targets/{name}",
        dependencies=guarded,
        status_code=201,
        response_model=TargetView,
        responses={
            **problems(400, 401, 408, 413),
            200: {"model": TargetView, "description": "Redefined (its cursor kept), or unchanged"},
            422: {"model": Refused, "description": "A definition that cannot be used (bad_target)"},
        },
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": TARGET}}}},
    )
    async def put_target(name: str, request: Request) -> JSONResponse:
        """Define a delivery target (SEMANTICS section 7): 201 when new, 200 when redefined or unchanged.

        The body: ``{"kind": "webhook", "url": ..., "subscriptions": "*" | [ids] | {"prefix": ...},
        "secret_file": ..., "timeout": 10, "batch": 500}``. A new target gets the deliveries committed from
        now on; a redefined one keeps its cursor.
        """
        raw = await read_body(request)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refusal(400, "malformed_json", f"the body is not JSON: {exc}") from None
        try:
            spec = TargetSpec.from_json(name, doc)
            new = await anyio.to_thread.run_sync(daemon.targets.put, spec)  # it writes and fsyncs a file
        except TargetError as exc:
            raise Refusal(422, "bad_target", str(exc)) from None
        return JSONResponse(daemon.targets.status(name), status_code=201 if new else 200)

    @app.get("/v1/targets", dependencies=guarded, response_model=TargetList, responses=problems(401))
    def list_targets() -> dict:
        """List the targets with their cursor, lag, state (``running`` or ``paused``) and last error."""
        return {"targets": daemon.targets.statuses()}

    @app.get("/v1/targets/{name}", dependencies=guarded, response_model=TargetView, responses=problems(401, 404))
    def get_target(name: str) -> dict:
        """Return a target's definition, cursor, lag (committed deliveries after it), state and last error."""
        status = daemon.targets.status(name)
        if status is None:
            raise HTTPException(404, f"no target {name!r}")
        return status

    @app.delete("/v1/targets/{name}", dependencies=guarded, response_model=Deleted, responses=problems(401, 404))
    def delete_target(name: str) -> dict:
        """Remove a target (its cursor goes with it)."""
        if not daemon.targets.delete(name):
            raise HTTPException(404, f"no target {name!r}")
        return {"deleted": name}

    @app.get("/healthz", response_model=Health)
    def healthz() -> dict:
        """Liveness (no token): the process answers."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        dependencies=guarded,
        response_model=Readiness,
        response_model_exclude_none=True,
        responses={**problems(401), 503: {"model": Readiness, "description": "Not ready (yet)"}},
    )
    def readyz() -> JSONResponse:
        """Readiness: the data plane has processed every acknowledged record (503 until then).

        ``phase`` says what the data plane does (``starting``, and then ``starting`` names what it starts;
        ``running``, ``failed``), ``committed_batch`` the last micro-batch committed and ``run_batch`` the
        last it ran (a restart replays journaled batches), so a client waits while they move; ``stalled`` says why,
        when the disk refuses the outputs (the commit is tried again every second).
        """
        body = {
            "ready": daemon.ready,
            "phase": daemon.phase,
            "starting": daemon.starting,
            "acknowledged": daemon.ingest.count,
            "processed": daemon.processed,
            "committed_batch": daemon.committed_batch,
            "run_batch": daemon.run_batch,
        }
        if daemon.stalled is not None:
            body["stalled"] = daemon.stalled
        return JSONResponse(body, status_code=200 if daemon.ready else 503)

    @app.get(
        "/metrics",
        dependencies=guarded,
        response_class=PlainTextResponse,
        responses={**problems(401), 200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    def metrics() -> PlainTextResponse:
        """Prometheus metrics of the data plane."""
        return PlainTextResponse(generate_latest(daemon.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def split_lines(body: bytes) -> list[bytes]:
    r"""Split a request body into records as a file run does: at ``\n``, one ``\r`` before it dropped, BOM skipped."""
    if body.startswith(BOM):
        body = body[len(BOM) :]
    lines = body.split(b"\n")
    last = lines.pop()  # after the last newline: a record only when not empty, its \r kept (no \n follows it)
    return [line[:-1] if line.endswith(b"\r") else line for line in lines] + ([last] if last else [])


class OffsetOutOfRange(Exception):  # noqa: N818 - named as Kafka names the answer
    """A read from an offset past the last committed entry of log ``name`` (whose last offset is ``end``)."""

    def __init__(self, name: str, end: int) -> None:
        super().__init__(f"offset past the end of {name}: its last committed offset is {end}")
        self.end = end
