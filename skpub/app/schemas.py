"""The daemon API's request and response bodies as typed models: they generate its OpenAPI document.

The models *describe*; they do not decide. A subscription body is checked
by the data plane's parser (:mod:`skpub.app.admission`, SEMANTICS section
7), so its schema below is attached to the operation as documentation
(``openapi_extra``) and never validates a request: one implementation of
the rules, and refusals that carry SEMANTICS reason codes. Response models
are the shapes the routes write (tested by schemathesis against the whole
document, ``tests/test_api_schema.py``). Lines of the output logs are
SEMANTICS section 5 lines with an ``offset``; their fields are listed, and
others may follow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Point = Annotated[list[float], Field(min_length=2, max_length=2, description="[x, y] in space units")]


class _Open(BaseModel):
    """A JSON object whose listed fields are described; others may follow."""

    model_config = ConfigDict(extra="allow")


class RangeDefinition(BaseModel):
    """A range subscription (SEMANTICS section 3.1): objects in ``rect`` whose terms satisfy the keywords."""

    kind: Literal["range"]
    rect: Annotated[list[float], Field(min_length=4, max_length=4, description="[xmin, ymin, xmax, ymax]")]
    keywords: list[str] | None = Field(None, description="All of them (one AND-clause); or give ``expr``")
    expr: str | None = Field(None, description="AND/OR expression over terms, with parentheses")


class TopkDefinition(BaseModel):
    """A top-k subscription (SEMANTICS section 3.2): the k best objects by kScore near ``point``."""

    kind: Literal["topk"]
    point: Point
    k: Annotated[int, Field(ge=1)]
    alpha: Annotated[float, Field(ge=0, le=1, description="Weight of spatial proximity against text relevance")]
    keywords: list[str] | None = None
    weights: dict[str, float] | None = Field(None, description="term -> weight, instead of ``keywords``")


class KnnDefinition(BaseModel):
    """A k-nearest-neighbour subscription (SEMANTICS section 3.3) over objects holding the keywords."""

    kind: Literal["knn"]
    point: Point
    k: Annotated[int, Field(ge=1)]
    keywords: list[str]
    match: Literal["any", "all"] = "any"
    from_: Literal["window", "registration"] = Field("window", alias="from")


Definition = Annotated[RangeDefinition | TopkDefinition | KnnDefinition, Field(discriminator="kind")]


class Accepted(BaseModel):
    """Lines appended to the ingest log: how many, and the first and last ingest positions (null when none)."""

    accepted: int
    first: int | None
    last: int | None


class Problem(BaseModel):
    """A refusal: what went wrong, in a sentence."""

    detail: str


class Refused(BaseModel):
    """A refused subscription request: a sentence and the SEMANTICS section 1 reason code."""

    detail: str
    reason: str


class GoneBody(BaseModel):
    """A read older than retention: the earliest offset still kept."""

    detail: str
    earliest: int


class OutOfRange(BaseModel):
    """A read past the end: the last committed offset (Kafka's OFFSET_OUT_OF_RANGE)."""

    detail: str
    end: int


class Delivery(_Open):
    """One delivery line (SEMANTICS section 5) with its offset."""

    offset: int
    sub: str
    event: Literal["match", "enter", "exit"]


class DeadLetterLine(_Open):
    """One dead letter (SEMANTICS section 1) with its offset, and the ingest position of its record.

    ``position`` is the one the request was answered with (``POST /v1/records``: ``first`` to ``last``); absent
    from the letters an skpub before 2026-11-29 committed, null for those of a batch it began and this one finished.
    """

    offset: int
    position: int | None = None
    line: str
    reason: str
    message: str


class SnapshotLine(_Open):
    """One snapshot line (SEMANTICS section 5) with its offset."""

    offset: int
    snapshot: str
    sub: str


class DeliveriesPage(BaseModel):
    """Deliveries after ``after``; ``next`` is the offset to pass as ``after`` next."""

    deliveries: list[Delivery]
    next: int


class DeadLettersPage(BaseModel):
    """Dead letters after ``after``; ``next`` is the offset to pass as ``after`` next."""

    dead_letters: list[DeadLetterLine]
    next: int


class SnapshotsPage(BaseModel):
    """Snapshot lines after ``after``; ``next`` is the offset to pass as ``after`` next."""

    snapshots: list[SnapshotLine]
    next: int


PAGES = {"deliveries": DeliveriesPage, "dead_letters": DeadLettersPage, "snapshots": SnapshotsPage}
"""Each output log's page model, by route name."""


class SubscribeRecord(_Open):
    """An accepted subscribe record as it was posted (SEMANTICS section 1)."""

    type: Literal["subscribe"]
    id: str
    kind: str


class SubscriptionView(BaseModel):
    """A live subscription: its record and, for topk and knn, its result ``[[object id, score or dist], ...]``."""

    subscription: SubscribeRecord
    result: list[list[Any]] | None = None


class SubscriptionPage(BaseModel):
    """Live subscriptions in id order; pass ``next`` as ``after`` for the next page (null at the end)."""

    subscriptions: list[SubscribeRecord]
    next: str | None


class SnapshotTaken(BaseModel):
    """A snapshot record appended: its id and ingest position."""

    id: str
    position: int


class SnapshotBody(BaseModel):
    """A snapshot's lines, in order (empty when no topk/knn subscription was active)."""

    lines: list[SnapshotLine]


class TargetView(BaseModel):
    """A delivery target: its definition, cursor (last offset handled), lag, state and counts.

    ``lag``: committed delivery lines after the cursor; ``lag_seconds``: the age of the first of them.
    """

    target: dict[str, Any]
    cursor: int
    lag: int
    lag_seconds: float
    state: Literal["running", "paused"]
    delivered: int
    failed: int
    behind_retention: int
    last_error: str | None


class TargetList(BaseModel):
    """Every target, by name."""

    targets: list[TargetView]


class Deleted(BaseModel):
    """What was removed."""

    deleted: str


class Health(BaseModel):
    """The process answers."""

    status: Literal["ok"]


class Readiness(BaseModel):
    """What the data plane does and how far it got (``GET /readyz``)."""

    ready: bool
    phase: Literal["starting", "running", "failed"]
    starting: str | None
    acknowledged: int
    processed: int
    committed_batch: int
    run_batch: int
    stalled: str | None = None


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Return FastAPI ``responses`` documenting ``statuses`` with :class:`Problem` bodies."""
    return {status: {"model": Problem, "description": _WHY.get(status, "Refused")} for status in statuses}


_WHY = {
    400: "The request is malformed",
    401: "The bearer token is missing or wrong",
    404: "Not found (yet)",
    408: "The body took too long to arrive",
    413: "The body is over the limit",
    429: "The ingest backlog is full; retry after Retry-After seconds",
    503: "The daemon is shutting down, or its data plane stopped",
    507: "The ingest log refused the write",
}
