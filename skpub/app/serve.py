"""``skpub serve``: the routing daemon in one process (the HTTP API on uvicorn, the data plane in a thread).

SIGTERM or SIGINT: uvicorn stops accepting connections and finishes the
requests in flight, then the data plane finishes its batch in flight and the
process exits 0. Restarted on the same data directory, it resumes (DESIGN
"The daemon").

The daemon logs JSON lines on standard error (:class:`JsonLines`): ``serving``
at start, one ``batch`` line per committed micro-batch, one ``refused`` line
per refused request. On the Spark engine, the JVM's and its workers' own
lines go to ``DATA/_engine.log``, as ``skpub run``'s go to its output's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import orjson
import stamina.instrumentation

from skpub.app.bearer import TOKEN_ENV
from skpub.app.console import lines_to_file
from skpub.app.daemon import LOG, Daemon, Limits
from skpub.app.output import ENGINE_LOG
from skpub.app.targets import TargetError, TargetSpec
from skpub.kernel.config import Deployment
from skpub.kernel.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:8750"


def parse_listen(listen: str) -> tuple[str, int]:
    """Return ``(host, port)`` of ``HOST:PORT`` (IPv6 hosts in brackets).

    Raises
    ------
    ConfigError
        If it is not such an address, or is an IPv4-mapped IPv6 one (the IPv4 address is the one to give).
    """
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT with an IP address") from None
    if address.version == 6 and address.ipv4_mapped is not None:
        raise ConfigError(f"--listen {listen!r}: an IPv4-mapped address; give the IPv4 one, {address.ipv4_mapped}")
    if not sep or not 0 <= number <= 65535:
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT with a port in 0..65535")
    return host, number


LISTEN_BACKLOG = 2048
"""Connections the kernel queues before the daemon accepts them (uvicorn's default)."""


def bind_listener(listen: str) -> socket.socket:
    """Return a TCP socket listening on ``HOST:PORT`` (port 0: one the kernel picks), for uvicorn to serve.

    Bound and listening before the daemon starts, so an address in use is a
    clear refusal and not a data plane started for nothing, and the port
    (``sock.getsockname()[1]``) is this process's from the start. An IPv6
    address listens on IPv6 only.

    Raises
    ------
    ConfigError
        If ``listen`` is malformed, or the address cannot be listened on (in use, not this host's, not permitted).
    """
    host, port = parse_listen(listen)
    six = ipaddress.ip_address(host).version == 6
    sock = None
    try:
        sock = socket.socket(socket.AF_INET6 if six else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds while old connections linger
        if six:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise ConfigError(f"--listen {listen}: cannot listen there: {exc.strerror or exc}") from None
    return sock


def listener_url(sock: socket.socket) -> str:
    """Return ``http://HOST:PORT`` of a bound socket (IPv6 hosts in brackets), its real port included."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


MAX_TARGETS_BYTES = 1 << 20
"""Largest ``--targets`` file read."""


def load_targets(path: str | Path) -> list[TargetSpec]:
    """Return the target definitions of a ``--targets`` file: ``{"name": {definition}, ...}``.

    Raises
    ------
    ConfigError
        If the file is not such a JSON object, or a definition cannot be used (the sentence names it).
    """
    with open(path, "rb") as fh:
        raw = fh.read(MAX_TARGETS_BYTES + 1)  # a larger file is refused, not read to its end
    if len(raw) > MAX_TARGETS_BYTES:
        raise ConfigError(f"--targets {path}: larger than {MAX_TARGETS_BYTES} bytes")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--targets {path}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f'--targets {path}: a JSON object {{"name": {{"kind": ..., "url": ...}}, ...}}')
    specs = []
    for name, definition in doc.items():
        try:
            specs.append(TargetSpec.from_json(name, definition))
        except TargetError as exc:
            raise ConfigError(f"--targets {path}: target {name!r}: {exc}") from None
    return specs


def serve(
    data: str | Path,
    deployment: Deployment,
    listen: str,
    token: str | None,
    limits: Limits | None = None,
    engine: str = "local",
    master: str = "local[2]",
    targets: Sequence[TargetSpec] = (),
) -> int:
    """Run the daemon until SIGTERM or SIGINT; return the exit status (0 after a clean shutdown).

    ``targets`` are defined (or redefined) at start, as ``PUT /v1/targets/{name}`` would. A ``listen``
    port of 0 takes a free port; the ``serving`` log line gives the URL with the port bound.

    Raises
    ------
    ConfigError
        If ``listen`` is not loopback and there is no token, is malformed or cannot be bound.
    JavaNotFoundError
        If ``engine`` is ``"spark"`` and no Java runtime is available.
    """
    host, _ = parse_listen(listen)
    if engine == "spark":
        from skpub.app.engines.spark import require_java

        require_java()
    if token is None and not ipaddress.ip_address(host).is_loopback:
        raise ConfigError(f"--listen {listen}: a non-loopback address needs a token (--token-file or ${TOKEN_ENV})")
    stamina.instrumentation.set_on_retry_hooks(
        []
    )  # no per-retry Prometheus series nor plain log lines: targets report their own
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(bind_listener(listen))
        daemon = Daemon(data, deployment, limits or Limits(), engine, master)  # refusals reach the terminal
        for spec in targets:
            try:
                daemon.targets.put(spec)
            except TargetError as exc:
                daemon.stop()
                raise ConfigError(f"--targets: target {spec.name!r}: {exc}") from None
        terminal = sys.stderr
        if engine == "spark":  # Spark's JVM and workers inherit fds 1 and 2: their lines go to a file
            terminal = stack.enter_context(lines_to_file(Path(data) / ENGINE_LOG, "skpub serve"))
        stack.enter_context(json_log(terminal))
        return _serve(daemon, token, sock)


def _serve(daemon: Daemon, token: str | None, sock: socket.socket) -> int:
    """Run uvicorn over ``daemon``'s API on the bound ``sock`` until a shutdown signal (:func:`serve`)."""
    import uvicorn

    from skpub.app.api import create_app

    app = create_app(daemon, token)
    data, engine, evaluators = daemon.data, daemon.engine, daemon.deployment.evaluators
    url = listener_url(sock)

    @contextlib.asynccontextmanager
    async def lifespan(_app):  # noqa: ANN001, ANN202 - FastAPI's lifespan protocol
        daemon.start()
        fields = {"data": str(data), "url": url, "engine": engine, "evaluators": evaluators}
        LOG.info("serving", extra={"fields": fields})
        yield
        daemon.stop()

    app.router.lifespan_context = lifespan
    # uvicorn's own lines go through the daemon's JSON log, to the terminal (json_log)
    config = uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=30, backlog=LISTEN_BACKLOG)
    # uvicorn handles SIGTERM/SIGINT while it serves, then raises the signal again under the handlers it found:
    # with these, a graceful shutdown ends the process with status 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    _server_class()(config, daemon).run(sockets=[sock])
    return 0 if daemon.failure is None else 1


def _server_class():  # noqa: ANN202 - uvicorn is imported when serving only
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, telling the daemon the moment a shutdown signal comes.

        Posts get 503 and streams end at once, so open streams do not hold
        the graceful shutdown; the data plane finishes its batch in flight.
        """

        def __init__(self, config: uvicorn.Config, daemon: Daemon) -> None:
            super().__init__(config)
            self.daemon = daemon

        def handle_exit(self, sig, frame) -> None:  # noqa: ANN001 - uvicorn's signature
            self.daemon.stopping.set()
            super().handle_exit(sig, frame)

    return Server


class JsonLines(logging.Formatter):
    """Format a log record as one JSON line: ``ts`` (UTC, ISO 8601), ``level``, ``event`` and its ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON object on one line."""
        stamp = datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")
        line = {"ts": stamp, "level": record.levelname.lower(), "event": record.getMessage()}
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


@contextlib.contextmanager
def json_log(stream: TextIO) -> Iterator[None]:
    """Write the daemon's log (:data:`skpub.app.daemon.LOG`) to ``stream`` as JSON lines for the block."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    server = logging.getLogger("uvicorn.error")  # uvicorn's warnings and errors, in the same form
    levels = LOG.level, server.level
    LOG.addHandler(handler)
    server.addHandler(handler)
    LOG.setLevel(logging.INFO)
    server.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOG.removeHandler(handler)
        server.removeHandler(handler)
        LOG.setLevel(levels[0])
        server.setLevel(levels[1])
