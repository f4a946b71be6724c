"""Baselines for reverse matching of range subscriptions: PostGIS and a shapely STRtree matcher.

These are what a user would pick instead of skpub to match a stream of
objects against boolean range subscriptions (rectangle + DNF keyword
expression; SEMANTICS section 3.1). Both read the same GeoNames stream as
skpub, from raw lines (reading and JSON parsing are timed, as skpub's are),
and return the set of ``(sub_id, obj_id)`` matches, which is checked equal
across the baselines and to skpub's deliveries.

Method
------
The stream starts with the initial ``live`` subscriptions (interleaved with
a few unsubscribes); they are *loaded* untimed. The timed part starts at the
first object record and runs to the end of the stream: objects are matched
in batches of 1,000, and the subscribe/unsubscribe churn between objects is
applied with stream-order semantics (an object matches exactly the
subscriptions live when it arrives). Each record gets its stream position
``seq``; a subscription carries ``born`` (position of its subscribe, -1 for
the loaded ones) and ``died`` (position of its unsubscribe, +inf while live),
and a pair matches only if ``born < seq(object) < died``. Churn is recorded
as it is read and applied before the next batch is matched; unsubscribed
subscriptions are removed once the batch that still needs them is matched.
So batches never have to be cut at churn (with 0.1 inserts per object they
would average ten objects).

* **PostGIS** (``postgis_matches``): a throw-away PostgreSQL 15 cluster is
  ``initdb``-ed in a ``tempfile.TemporaryDirectory()`` and started listening
  on a unix socket in that directory only (``listen_addresses = ''``: no TCP
  port is bound, so the port number only names the socket and never
  collides). PostgreSQL refuses to run as root, so when the benchmark runs as
  root the server runs as the ``postgres`` system account that Debian's
  ``postgresql-15`` package creates (or, if absent, a ``skpub-bench`` system
  user created with ``useradd``), through ``subprocess``'s ``user=``/``group=``
  (no sudo/runuser needed); the temp directory is chowned to it. The server
  is always stopped (fast shutdown, then SIGQUIT/SIGKILL) and the directory
  removed, also on error or Ctrl-C (context manager ``postgres_server``).
  Tuning, to be fair to the baseline: an UNLOGGED table with one row per
  (subscription, AND-clause): ``rect geometry`` (ST_MakeEnvelope, a GiST
  index), ``terms text[]`` (a GIN index with ``fastupdate = off``: with the
  default pending list every probe scans the recent inserts, 20x slower
  here), the float8 corners, ``born``/``died``; bulk COPY, indexes built
  after the load, CLUSTER on the GiST index, ANALYZE; autovacuum tuned for
  the churned table (1 s naptime, scale factor 0.02: without it dead index
  entries cut the speed by up to 40% by the end of a stream); fsync/
  synchronous_commit/full_page_writes off, 1 GB shared buffers,
  ``jit = off``, ``plan_cache_mode = force_custom_plan`` (the plan timed
  below is the plan used), no parallel workers (2 cores, one used by the
  Python client). Each batch is ONE prepared SQL join: the objects are passed as
  arrays and ``unnest()``-ed into a materialized CTE, joined on the
  subscriptions with ``clause_terms <@ object_terms``, the rectangle test
  (closed, exact in doubles) and the ``born/died`` test. Which index drives
  the join decides the speed and the planner does not always pick the best,
  so three plans (``PLANS``) are timed on the first three batches of objects
  right after the load (untimed) and the fastest is kept: ``planner``
  (``ST_Intersects`` join, both indexes usable; at 100k live it ANDs a GiST
  and a GIN bitmap), ``gist`` (same query, bitmap scans off: a GiST index
  scan per object, keywords as a filter; wins on dense keywords) and ``gin``
  (join on ``terms <@`` only, rectangle on the float8 columns: a GIN scan per
  object; wins on rare keywords by 4-5x). The churn of a batch costs at most
  one INSERT (unnest), one UPDATE and one DELETE.
* **shapely STRtree** (``strtree_matches``): what a Python user writes in a
  few dozen lines: shapely 2 boxes in an ``STRtree``, one bulk
  ``tree.query(points)`` per batch, then the ``born/died`` test in numpy and
  the keyword test in Python (``clause <= object_terms``). The tree is
  immutable: new subscriptions go into a small delta tree rebuilt lazily
  before a batch when subscriptions were added, and both trees are rebuilt
  (dropping unsubscribed entries) once the delta or the dead entries exceed
  10% of the main tree. The query uses no predicate: the tree's envelopes of
  boxes are the boxes themselves, and envelope intersection is closed and
  exact in doubles, so it equals ``predicate="intersects"`` at less cost.

Throughput is objects/s of the timed part (after the initial subscriptions
are loaded). skpub's own numbers in the table are parsed from its run
summary (``skpub run --engine local``): over the whole run, and after its
first micro-batch of 100,000 records; the baselines' are over the object
part only, so compare with the latter.

Run::

    .venv/bin/python -m benchmarks.baselines [--live 10000 100000] [--mix sparse dense] [--work DIR]

``sparse`` is the default workload (``--keyword-percentile 99``: the 1% most
frequent terms are never keywords; 0.4 matches/object at 100k live).
``dense`` uses 99.998: only the 16 most frequent terms (``de``, ``us``,
``asia/shanghai``, ``europe/paris`` and the like) are never keywords, which gives 26
matches/object at 100k live; ``all-terms`` (100, not run by default) gives 55. Needs
``apt-get install postgresql-15-postgis-3`` (with PostgreSQL 15) and
``pip install 'psycopg[binary]' shapely``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

from skpub.kernel.errors import ExpressionError
from skpub.kernel.runtime import GEN0_THRESHOLD
from skpub.kernel.text import parse_expression

PG_BIN = Path("/usr/lib/postgresql/15/bin")
BATCH = 1_000
MIXES = {"sparse": 99.0, "dense": 99.998, "all-terms": 100.0}
"""``--keyword-percentile`` of each keyword mix (matches/object at 100k live: 0.4, 26, 55)."""
_NEVER = 2**62
_SEP = "\x1f"  # joins the terms of one object or clause into one text; no term holds it
Rect = tuple[float, float, float, float]
DNF = tuple[frozenset[str], ...]


# --------------------------------------------------------------------------- the stream


def _clauses(rec: dict) -> DNF:
    """Return the DNF of a range subscription; empty if skpub rejects it (``bad_expr``, ``empty_keywords``).

    In the dense mix a keyword may be the term ``and`` or ``or``, which makes
    an ``expr`` unparsable: skpub dead-letters that subscription (and its
    unsubscribe as ``unknown_id``), so the baselines skip it too.
    """
    keywords = rec.get("keywords")
    if keywords is not None:
        return (frozenset(keywords),) if keywords else ()
    try:
        return tuple(parse_expression(rec["expr"]))
    except ExpressionError:
        return ()


class _Matcher:
    """What the stream driver needs from a baseline."""

    def load(self, subs: dict[str, tuple[Rect, DNF]]) -> None:
        raise NotImplementedError

    def subscribe(self, seq: int, sid: str, rect: Rect, clauses: DNF) -> None:
        raise NotImplementedError

    def unsubscribe(self, seq: int, sid: str) -> None:
        raise NotImplementedError

    def match(self, ids: list, xs: list, ys: list, seqs: list, terms: list, out: set) -> None:
        raise NotImplementedError


def _drive(stream_path: str | Path, live: int | None, matcher: _Matcher, batch: int) -> tuple[set, float, int]:
    """Load the initial subscriptions untimed, then time matching the rest of the stream.

    The load phase ends at the first object record, or at the ``live + 1``-th
    subscribe record if ``live`` is given and that comes first.
    """
    loads = orjson.loads
    subs: dict[str, tuple[Rect, DNF]] = {}
    accepted: set[str] = set()  # subscription ids are unique for the whole stream (SEMANTICS 1)
    subscribed = 0
    first = None
    with contextlib.ExitStack() as stack:
        fh = stack.enter_context(open(stream_path, "rb"))
        for line in fh:
            rec = loads(line)
            kind = rec["type"]
            if kind == "subscribe":
                if live is not None and subscribed == live:
                    first = line
                    break
                subscribed += 1
                clauses = _clauses(rec)
                if clauses and rec["id"] not in accepted:
                    accepted.add(rec["id"])
                    subs[rec["id"]] = (tuple(rec["rect"]), clauses)
            elif kind == "unsubscribe":
                subs.pop(rec["id"], None)
            elif kind == "object":
                first = line
                break
        matcher.load(subs)
        del subs
        stack.enter_context(_gc_tuned())
        matches: set[tuple[str, str]] = set()
        ids, xs, ys, seqs, terms = [], [], [], [], []
        n = 0
        start = time.perf_counter()
        if first is not None:
            for seq, line in enumerate(_chain(first, fh)):
                rec = loads(line)
                kind = rec["type"]
                if kind == "object":
                    ids.append(rec["id"])
                    xs.append(rec["x"])
                    ys.append(rec["y"])
                    seqs.append(seq)
                    terms.append(rec["terms"])
                    if len(ids) == batch:
                        matcher.match(ids, xs, ys, seqs, terms, matches)
                        n += len(ids)
                        ids, xs, ys, seqs, terms = [], [], [], [], []
                elif kind == "subscribe":
                    clauses = _clauses(rec)
                    if clauses and rec["id"] not in accepted:
                        accepted.add(rec["id"])
                        matcher.subscribe(seq, rec["id"], tuple(rec["rect"]), clauses)
                elif kind == "unsubscribe":
                    matcher.unsubscribe(seq, rec["id"])
            if ids:
                matcher.match(ids, xs, ys, seqs, terms, matches)
                n += len(ids)
        seconds = time.perf_counter() - start
    return matches, n / seconds if seconds > 0 else 0.0, n


@contextlib.contextmanager
def _gc_tuned() -> Iterator[None]:
    """Tune the collector as skpub's engines do (``tune_gc``: freeze the heap, ``GEN0_THRESHOLD``); undo on exit.

    Without it CPython's collector rescans the millions of live match tuples
    (and whatever the caller holds) over and over while a run allocates.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _chain(first: bytes, rest) -> Iterator[bytes]:
    yield first
    yield from rest


# --------------------------------------------------------------------------- PostGIS


def _server_account() -> tuple[int, int] | None:
    """Return (uid, gid) to run postgres as, or None to run as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "skpub-bench"):
        try:
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            pass
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", "skpub-bench"],
        check=True,
    )
    entry = pwd.getpwnam("skpub-bench")
    return entry.pw_uid, entry.pw_gid


SERVER_SETTINGS = {
    "listen_addresses": "",
    "unix_socket_permissions": "0700",
    "shared_buffers": "1GB",
    "work_mem": "64MB",
    "maintenance_work_mem": "1GB",
    "effective_cache_size": "8GB",
    "random_page_cost": "1.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
    "jit": "off",
    "plan_cache_mode": "force_custom_plan",
    "max_parallel_workers_per_gather": "0",
    "logging_collector": "off",
    "autovacuum_naptime": "1s",
}


@contextlib.contextmanager
def postgres_server(bin_dir: Path = PG_BIN, port: int = 5432, settings: dict | None = None) -> Iterator[dict]:
    """Run a throw-away PostgreSQL cluster in a temporary directory.

    Parameters
    ----------
    bin_dir : Path
        Directory of ``initdb`` and ``postgres``.
    port : int
        Names the unix socket ``.s.PGSQL.<port>``; no TCP port is bound.
    settings : dict, optional
        Server settings added to (and overriding) ``SERVER_SETTINGS``.

    Yields
    ------
    dict
        Keyword arguments for ``psycopg.connect``.
    """
    account = _server_account()
    as_user = {"user": account[0], "group": account[1], "extra_groups": []} if account else {}
    with tempfile.TemporaryDirectory(prefix="skpub-pg-") as tmp:
        if account:
            os.chown(tmp, *account)
        data, log_path = Path(tmp) / "data", Path(tmp) / "server.log"
        initdb = subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "bench", "--auth=trust", "--encoding=UTF8",
             "--locale=C", "--no-sync", "--no-instructions"],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **as_user,
        )  # fmt: skip
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}):\n{initdb.stderr}")
        options = {**SERVER_SETTINGS, "unix_socket_directories": tmp, "port": str(port), **(settings or {})}
        argv = [str(bin_dir / "postgres"), "-D", str(data)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **as_user
            )
        try:
            conninfo = {"host": tmp, "port": port, "user": "bench", "dbname": "postgres"}
            _wait_ready(proc, conninfo, log_path)
            yield conninfo
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen, conninfo: dict, log_path: Path, timeout: float = 60.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            psycopg.connect(**conninfo, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    """Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL of the postmaster's group."""
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGQUIT, 10)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group is the server's alone
    proc.wait()


_SCHEMA = """
CREATE EXTENSION IF NOT EXISTS postgis;
CREATE UNLOGGED TABLE subs (
    sid   text   NOT NULL,
    x0 float8 NOT NULL, y0 float8 NOT NULL, x1 float8 NOT NULL, y1 float8 NOT NULL,
    rect  geometry GENERATED ALWAYS AS (ST_MakeEnvelope(x0, y0, x1, y1)) STORED,
    terms text[] NOT NULL,
    born  int8   NOT NULL,
    died  int8   NOT NULL
);
"""
_INDEXES = """
CREATE INDEX subs_rect ON subs USING gist (rect);
CREATE INDEX subs_terms ON subs USING gin (terms) WITH (fastupdate = off);  -- no pending list to scan per probe
CREATE INDEX subs_sid ON subs (sid);
ALTER TABLE subs SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500);
CLUSTER subs USING subs_rect;
ANALYZE subs;
"""
_INSERT = """
INSERT INTO subs (sid, x0, y0, x1, y1, terms, born, died)
SELECT sid, x0, y0, x1, y1, string_to_array(t, chr(31)), born, %s
FROM unnest(%s::text[], %s::float8[], %s::float8[], %s::float8[], %s::float8[], %s::text[], %s::int8[])
     AS u(sid, x0, y0, x1, y1, t, born)
"""
_KILL = """
UPDATE subs SET died = u.seq FROM unnest(%s::text[], %s::int8[]) AS u(sid, seq) WHERE subs.sid = u.sid
"""
_DELETE = "DELETE FROM subs WHERE sid = ANY(%s::text[])"
_OBJECTS = """
WITH o AS MATERIALIZED (
    SELECT id, seq, x, y, ST_MakePoint(x, y) AS pt, string_to_array(t, chr(31)) AS terms
    FROM unnest(%s::text[], %s::float8[], %s::float8[], %s::int8[], %s::text[]) AS u(id, x, y, seq, t)
)
"""
_MATCH_SPATIAL = (
    _OBJECTS
    + """SELECT s.sid, o.id FROM o JOIN subs s ON ST_Intersects(s.rect, o.pt)
WHERE s.terms <@ o.terms AND s.born < o.seq AND o.seq < s.died"""
)
_MATCH_KEYWORD = (
    _OBJECTS
    + """SELECT s.sid, o.id FROM o JOIN subs s ON s.terms <@ o.terms
WHERE o.x BETWEEN s.x0 AND s.x1 AND o.y BETWEEN s.y0 AND s.y1 AND s.born < o.seq AND o.seq < s.died"""
)
PLANS = {
    # both indexes usable, the planner picks (at 100k live: a BitmapAnd of the GiST and GIN scans)
    "planner": (_MATCH_SPATIAL, "on"),
    # bitmap scans off, so GIN (bitmap-only) is out: a GiST index scan per object, keywords as a filter
    "gist": (_MATCH_SPATIAL, "off"),
    # no spatial index condition: a GIN scan per object, the rectangle tested exactly on the float8 columns
    "gin": (_MATCH_KEYWORD, "on"),
}
"""Match-query plans; ``postgis_matches(plan="auto")`` times each on a sample after the load and keeps the fastest."""


class _PostgisMatcher(_Matcher):
    def __init__(self, conn, plan: str, sample: list[list], info: dict) -> None:
        self.conn, self.plan, self.sample, self.info = conn, plan, sample, info
        self.new: list[tuple] = []
        self.gone: list[tuple[str, int]] = []
        conn.execute(_SCHEMA)

    def load(self, subs: dict[str, tuple[Rect, DNF]]) -> None:
        with self.conn.cursor() as cur:
            with cur.copy("COPY subs (sid, x0, y0, x1, y1, terms, born, died) FROM STDIN") as copy:
                copy.set_types(["text", "float8", "float8", "float8", "float8", "text[]", "int8", "int8"])
                for sid, (rect, clauses) in subs.items():
                    for clause in clauses:
                        copy.write_row((sid, *rect, sorted(clause), -1, _NEVER))
            cur.execute(_INDEXES)
        if self.plan == "auto":
            rates = {name: self._rate(name) for name in PLANS}
            self.info["calibration"] = rates
            self.plan = max(rates, key=rates.get)
        self.info["plan"] = self.plan
        self.query, bitmap = PLANS[self.plan]
        self.conn.execute(f"SET enable_bitmapscan = {bitmap}")

    def _rate(self, name: str) -> float:
        """Objects/s of plan ``name`` on the sample batches (best of two rounds)."""
        query, bitmap = PLANS[name]
        self.conn.execute(f"SET enable_bitmapscan = {bitmap}")
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            for params in self.sample:
                self.conn.execute(query, params, prepare=True).fetchall()
            best = min(best, time.perf_counter() - start)
        return sum(len(params[0]) for params in self.sample) / best

    def subscribe(self, seq: int, sid: str, rect: Rect, clauses: DNF) -> None:
        self.new.extend((sid, *rect, _SEP.join(clause), seq) for clause in clauses)

    def unsubscribe(self, seq: int, sid: str) -> None:
        self.gone.append((sid, seq))

    def match(self, ids: list, xs: list, ys: list, seqs: list, terms: list, out: set) -> None:
        cur = self.conn.cursor()
        if self.new:
            cur.execute(_INSERT, [_NEVER, *map(list, zip(*self.new, strict=True))])
            self.new = []
        gone = [sid for sid, _ in self.gone]
        if gone:
            cur.execute(_KILL, (gone, [seq for _, seq in self.gone]))
            self.gone = []
        joined = [_SEP.join(t) for t in terms]
        cur.execute(self.query, (ids, xs, ys, seqs, joined), prepare=True)
        out.update(cur.fetchall())
        if gone:
            cur.execute(_DELETE, (gone,))


def _sample_batches(stream_path: str | Path, batches: int, batch: int) -> list[list]:
    """Return match-query parameters for the stream's first ``batches * batch`` objects (all at ``seq`` 0)."""
    rows = []
    with open(stream_path, "rb") as fh:
        for line in fh:
            rec = orjson.loads(line)
            if rec["type"] == "object":
                rows.append((rec["id"], rec["x"], rec["y"], 0, _SEP.join(rec["terms"])))
                if len(rows) == batches * batch:
                    break
    return [[list(col) for col in zip(*rows[i : i + batch], strict=True)] for i in range(0, len(rows), batch)]


def postgis_matches(
    stream_path: str | Path,
    live: int | None = None,
    batch: int = BATCH,
    plan: str = "auto",
    info: dict | None = None,
    explain: bool = False,
) -> tuple[set[tuple[str, str]], float, int]:
    """Match a stream with PostGIS in a throw-away PostgreSQL cluster.

    Parameters
    ----------
    stream_path : str or Path
        JSON-lines stream (initial subscriptions, then objects with churn).
    live : int, optional
        Number of initial subscriptions (the untimed load phase); by default
        the load phase is everything before the first object.
    batch : int
        Objects per SQL join.
    plan : str
        A key of ``PLANS``, or ``"auto"``: after the load (untimed), time each
        plan on the stream's first three batches of objects and keep the fastest.
    info : dict, optional
        Filled with ``plan`` (the plan used) and, for ``"auto"``,
        ``calibration`` (objects/s of each plan on the sample).
    explain : bool
        Print EXPLAIN ANALYZE of the match query on one sample batch to stderr, at the end.

    Returns
    -------
    (set of (str, str), float, int)
        The ``(sub_id, obj_id)`` matches, objects/s after the load, and the number of objects.
    """
    import psycopg

    info = {} if info is None else info
    if plan != "auto" and plan not in PLANS:
        raise ValueError(f"plan must be 'auto' or one of {sorted(PLANS)}, got {plan!r}")
    sample = _sample_batches(stream_path, 3, batch)
    with postgres_server() as conninfo, psycopg.connect(**conninfo, autocommit=True) as conn:
        matcher = _PostgisMatcher(conn, plan, sample, info)
        result = _drive(stream_path, live, matcher, batch)
        if explain and sample:
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + matcher.query, sample[0])
            print(f"PostGIS plan {info['plan']!r}:", *(r[0] for r in rows), sep="\n", file=sys.stderr)
    return result


# --------------------------------------------------------------------------- shapely STRtree


class _StrtreeMatcher(_Matcher):
    """Main STRtree + a lazily rebuilt delta tree for new subscriptions; dead entries filtered by ``died``."""

    def __init__(self, rebuild_fraction: float = 0.1) -> None:
        import shapely

        self.shapely = shapely
        self.rebuild_fraction = rebuild_fraction
        self.sids: list[str] = []
        self.clauses: list[DNF] = []
        self.geoms: list = []
        self.born = np.empty(0, np.int64)
        self.died = np.empty(0, np.int64)
        self.slot: dict[str, int] = {}
        self.dead = 0
        self.built = 0
        self.main = self.delta = None
        self.delta_stale = False

    def load(self, subs: dict[str, tuple[Rect, DNF]]) -> None:
        rects = np.array([rect for rect, _ in subs.values()], dtype=np.float64).reshape(-1, 4)
        self.sids = list(subs)
        self.clauses = [clauses for _, clauses in subs.values()]
        self.geoms = list(self.shapely.box(rects[:, 0], rects[:, 1], rects[:, 2], rects[:, 3]))
        self.born = np.full(len(self.sids), -1, np.int64)
        self.died = np.full(len(self.sids), _NEVER, np.int64)
        self._rebuild()

    def _rebuild(self) -> None:
        """Drop unsubscribed entries and build the main tree over all the others; no delta."""
        n = len(self.sids)
        keep = np.flatnonzero(self.died[:n] == _NEVER).tolist()
        self.sids = [self.sids[i] for i in keep]
        self.clauses = [self.clauses[i] for i in keep]
        self.geoms = [self.geoms[i] for i in keep]
        self.born = self.born[keep].copy()
        self.died = np.full(len(keep), _NEVER, np.int64)
        self.slot = {sid: i for i, sid in enumerate(self.sids)}
        self.dead = 0
        self.built = len(keep)
        self.main = self.shapely.STRtree(self.geoms)
        self.delta, self.delta_stale = None, False

    def subscribe(self, seq: int, sid: str, rect: Rect, clauses: DNF) -> None:
        i = len(self.sids)
        if i == len(self.born):  # grow the numpy columns geometrically
            grow = max(1024, i)
            self.born = np.concatenate([self.born, np.empty(grow, np.int64)])
            self.died = np.concatenate([self.died, np.empty(grow, np.int64)])
        self.sids.append(sid)
        self.clauses.append(clauses)
        self.geoms.append(self.shapely.box(*rect))
        self.born[i], self.died[i] = seq, _NEVER
        self.slot[sid] = i
        self.delta_stale = True

    def unsubscribe(self, seq: int, sid: str) -> None:
        i = self.slot.pop(sid, None)
        if i is not None:
            self.died[i] = seq
            self.dead += 1

    def match(self, ids: list, xs: list, ys: list, seqs: list, terms: list, out: set) -> None:
        if self.delta_stale:
            self.delta = self.shapely.STRtree(self.geoms[self.built :])
            self.delta_stale = False
        points = self.shapely.points(xs, ys)
        pi, si = self.main.query(points)
        if self.delta is not None:
            dpi, dsi = self.delta.query(points)
            pi, si = np.concatenate([pi, dpi]), np.concatenate([si, dsi + self.built])
        seq = np.asarray(seqs, np.int64)[pi]
        alive = (self.born[si] < seq) & (seq < self.died[si])
        sids, clauses = self.sids, self.clauses
        term_sets = [frozenset(t) for t in terms]
        for p, s in zip(pi[alive].tolist(), si[alive].tolist(), strict=True):
            have = term_sets[p]
            for clause in clauses[s]:
                if clause <= have:
                    out.add((sids[s], ids[p]))
                    break
        limit = self.rebuild_fraction * max(self.built, 1)
        if len(self.sids) - self.built > limit or self.dead > limit:
            self._rebuild()


def strtree_matches(
    stream_path: str | Path, live: int | None = None, batch: int = BATCH
) -> tuple[set[tuple[str, str]], float, int]:
    """Match a stream with shapely 2 STRtrees plus a keyword check in Python.

    Parameters
    ----------
    stream_path : str or Path
        JSON-lines stream (initial subscriptions, then objects with churn).
    live : int, optional
        Number of initial subscriptions (the untimed load phase); by default
        the load phase is everything before the first object.
    batch : int
        Objects per bulk tree query.

    Returns
    -------
    (set of (str, str), float, int)
        The ``(sub_id, obj_id)`` matches, objects/s after the load, and the number of objects.
    """
    return _drive(stream_path, live, _StrtreeMatcher(), batch)


# --------------------------------------------------------------------------- skpub and the table


def _skpub(*args: str) -> str:
    """Run the ``skpub`` console command (next to this Python) and return its standard output."""
    exe = Path(sys.executable).with_name("skpub")
    proc = subprocess.run([str(exe) if exe.exists() else "skpub", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"skpub {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def make_workload(directory: Path, live: int, percentile: float, objects: int | None) -> tuple[Path, Path]:
    """Write (or reuse) a range-only GeoNames workload with ``skpub workload geonames``; return (stream, vocabulary).

    The baselines match range subscriptions only, so the workload has no
    topk/knn subscriptions and no window.
    """
    extra = ["--objects", str(objects)] if objects is not None else []
    args = ["--live", str(live), "--keyword-percentile", str(percentile), *extra]
    args += ["--topk-fraction", "0", "--knn-fraction", "0", "--window", "0"]
    _skpub("workload", "geonames", "--output", str(directory), *args)
    return directory / "stream.jsonl", directory / "vocabulary.json"


_RATES = re.compile(r"objects\s+\d+ \(([\d,]+) objects/s .*?; ([\d,]+)/s after the first batch\)")


def skpub_matches(stream: Path, vocabulary: Path, work: Path, *engine: str) -> tuple[set[tuple[str, str]], str]:
    """Run ``skpub run`` (local engine unless ``engine`` says otherwise); return its matches and its summary.

    The output goes to a temporary directory under ``work``, created here and
    removed when the matches are read.
    """
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        out = Path(tmp) / "out"
        summary = _skpub(
            "run", *(engine or ("--engine", "local")), "--input", str(stream), "--vocabulary", str(vocabulary),
            "--output", str(out), "--quiet", "--batch-size", "100000",
        )  # fmt: skip
        matches = set()
        for part in sorted((out / "deliveries").glob("part-*.jsonl")):
            with open(part, "rb") as fh:
                matches.update((row["sub"], row["obj"]) for row in map(orjson.loads, fh) if row["event"] == "match")
    return matches, summary


def main(argv: list[str] | None = None) -> None:
    """Run the baselines (and skpub) on each workload and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--mix", nargs="+", choices=sorted(MIXES), default=["sparse", "dense"])
    parser.add_argument("--objects", type=int, default=None, help="cut the workload to this many objects")
    parser.add_argument("--work", default="bench-out/baselines", help="workloads and skpub output go here")
    parser.add_argument("--no-skpub", action="store_true", help="do not run skpub nor compare with it")
    parser.add_argument("--plan", choices=["auto", *PLANS], default="auto", help="PostGIS match plan")
    parser.add_argument("--explain", action="store_true", help="print PostGIS's plan of one batch to stderr")
    args = parser.parse_args(argv)
    root = Path(args.work)
    print(
        "| workload | live subs | objects | matches/object | PostGIS obj/s (plan) | STRtree obj/s "
        "| skpub obj/s (run / after 1st batch) | PostGIS = STRtree | = skpub |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|", flush=True)
    for mix in args.mix:
        for live in args.live:
            name = f"{mix}-{live}" + (f"-{args.objects}" if args.objects else "")
            stream, vocabulary = make_workload(root / f"workload-{name}", live, MIXES[mix], args.objects)
            info: dict = {}
            pg, pg_rate, n = postgis_matches(stream, live, plan=args.plan, info=info, explain=args.explain)
            if "calibration" in info:
                rates = ", ".join(f"{k} {v:,.0f}" for k, v in info["calibration"].items())
                print(f"[{name}] PostGIS plans on the first batches, objects/s: {rates}", file=sys.stderr, flush=True)
            tree, tree_rate, n_tree = strtree_matches(stream, live)
            assert n == n_tree, (n, n_tree)
            same = "yes" if pg == tree else f"NO ({len(pg ^ tree)} differ)"
            del tree
            versus, skpub_rate = "not run", "-"
            if not args.no_skpub:
                theirs, summary = skpub_matches(stream, vocabulary, root)
                found = re.search(
                    r"objects\s+\d+ \(([\d,]+) objects/s .*?; ([\d,]+)/s after the first batch\)", summary
                )
                skpub_rate = f"{found.group(1)} / {found.group(2)}" if found else "?"
                versus = "yes" if theirs == pg else f"NO ({len(theirs - pg)} only skpub, {len(pg - theirs)} only ours)"
                del theirs
            percentile = json.dumps(MIXES[mix])
            print(
                f"| {mix} (percentile {percentile}) | {live:,} | {n:,} | {len(pg) / max(n, 1):.2f} "
                f"| {pg_rate:,.0f} ({info['plan']}) | {tree_rate:,.0f} | {skpub_rate} | {same} | {versus} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
