"""The CLI verbs that talk to a running daemon (``publish``, ``subscribe``, ``follow``, ...).

The verbs are ``publish``, ``subscribe``, ``unsubscribe``, ``subscriptions``,
``follow`` and ``targets``. Each is a thin shell over :class:`skpub.client.Client`: ``--url`` (default
``$SKPUB_URL`` or ``http://127.0.0.1:8750``) and ``--token-file`` (default
``$SKPUB_TOKEN``) say which daemon; answers are printed as JSON, one per
line, on standard output; a refusal is printed on standard error with its
status and SEMANTICS reason, and the exit status is 1; a daemon that does
not answer within ``--retry-seconds`` (10) is an error, status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import IO

import httpx

from skpub.app.bearer import load_token
from skpub.client import FLUSH, LOGS, Client, Refused, live_lines, save_cursor
from skpub.kernel.errors import ConfigError

LINGER = 0.2
"""Most seconds a line read from a live standard input waits before it is sent (``publish -``)."""
VERBS = ("publish", "subscribe", "unsubscribe", "subscriptions", "follow", "targets")


def add_verbs(sub: argparse._SubParsersAction) -> None:
    """Add the daemon verbs to the ``skpub`` command's subparsers."""

    def verb(name: str, help_text: str, retry: float = 10.0) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--url", help="the daemon's URL (default $SKPUB_URL or http://127.0.0.1:8750)")
        parser.add_argument("--token-file", help="file holding the bearer token (default $SKPUB_TOKEN)")
        parser.add_argument(
            "--retry-seconds",
            type=float,
            default=retry,
            help=f"retry an unreachable daemon this long (default {retry:g})",
        )
        return parser

    publish = verb("publish", "append JSON-lines records to a running daemon")
    publish.add_argument("file", help="JSON-lines file, or - for standard input")
    subscribe = verb("subscribe", "subscribe an id on a running daemon")
    subscribe.add_argument("id", help="subscription id")
    subscribe.add_argument(
        "definition", help='the definition as JSON ({"kind": "range", "rect": [...], "keywords": [...]}) or @FILE'
    )
    unsubscribe = verb("unsubscribe", "unsubscribe an id on a running daemon")
    unsubscribe.add_argument("id", help="subscription id")
    listing = verb("subscriptions", "list a running daemon's live subscriptions in id order")
    listing.add_argument("--kind", choices=("range", "topk", "knn"), help="only this kind")
    follow = verb("follow", "print a running daemon's deliveries (or other log) as they come, resuming by itself", 3600)
    follow.add_argument("--after", type=int, help="start after this offset (default: the cursor's, else 0)")
    follow.add_argument("--log", choices=LOGS, default="deliveries", help="which log (default deliveries)")
    follow.add_argument("--subscription", help="only this subscription's lines")
    follow.add_argument("--cursor", help="file keeping the last offset printed, to resume from")
    follow.add_argument("--sse", action="store_true", help="read the Server-Sent Events stream, not long polls")
    follow.add_argument("--count", type=int, help="stop after this many lines")
    follow.add_argument("--idle-stop", action="store_true", help="stop when a long poll brings nothing")
    targets = verb("targets", "list, show, define or delete a running daemon's delivery targets")
    targets.add_argument("name", nargs="?", help="one target (default: list them all)")
    action = targets.add_mutually_exclusive_group()
    action.add_argument(
        "--define", metavar="JSON", help='define NAME: {"kind": "webhook", "url": ..., "subscriptions": "*"} or @FILE'
    )
    action.add_argument("--delete", action="store_true", help="delete NAME and its cursor")


def run_verb(args: argparse.Namespace) -> int:
    """Run daemon verb ``args.command``; return the exit status (1 for a refusal).

    Raises
    ------
    ConfigError
        For a bad token file or definition argument.
    """
    with Client(args.url, token=load_token(args.token_file), retry_seconds=args.retry_seconds) as client:
        try:
            for answer in _answers(client, args):
                print(json.dumps(answer, ensure_ascii=False), flush=True)
        except Refused as refused:
            print(f"skpub: refused: {refused}", file=sys.stderr)
            return 1
        except httpx.TransportError as exc:
            print(f"skpub: error: no answer from the daemon at {client.http.base_url}: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:  # a cursor file that holds no offset
            print(f"skpub: error: {exc}", file=sys.stderr)
            return 2
    return 0


def _answers(client: Client, args: argparse.Namespace) -> Iterator[dict]:
    if args.command == "publish":
        if args.file == "-" and _live(sys.stdin):  # a pipe or a terminal (tail -f): a body at least every 0.2 s
            yield client.publish(x if x is FLUSH else _record(x) for x in live_lines(sys.stdin.fileno(), LINGER))
            return
        source = sys.stdin.buffer if args.file == "-" else Path(args.file).open("rb")  # noqa: SIM115 - closed below
        try:
            yield client.publish(_record(line) for line in source)
        finally:
            if source is not sys.stdin.buffer:
                source.close()
    elif args.command == "subscribe":
        yield client.subscribe(args.id, _definition(args.definition))
    elif args.command == "unsubscribe":
        yield client.unsubscribe(args.id)
    elif args.command == "subscriptions":
        yield from client.subscriptions(kind=args.kind)
    elif args.command == "targets":
        yield from _targets(client, args)
    else:
        lines = client.follow(args.after, args.log, args.subscription, args.cursor, args.sse, idle_stop=args.idle_stop)
        for line in islice(lines, args.count) if args.count is not None else lines:
            yield line
            if args.cursor is not None:  # printed: handled (follow saves it only when the next one is asked for)
                save_cursor(args.cursor, line["offset"])


def _targets(client: Client, args: argparse.Namespace) -> Iterator[dict]:
    if args.name is None:
        if args.define is not None or args.delete:
            raise ConfigError("--define and --delete need a target NAME")
        yield from client.targets()
    elif args.define is not None:
        yield client.define_target(args.name, _definition(args.define))
    elif args.delete:
        if not client.delete_target(args.name):
            raise Refused(404, f"no target {args.name!r}")
        yield {"deleted": args.name}
    else:
        status = client.target(args.name)
        if status is None:
            raise Refused(404, f"no target {args.name!r}")
        yield status


def _live(stream: IO) -> bool:
    """Whether ``stream`` is a pipe, a socket or a terminal: input that may pause, not a file read to its end."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):  # no descriptor (replaced in tests, or closed)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


def _record(line: bytes) -> bytes:
    r"""Return a line read from a file without its terminator: ``\n``, and one ``\r`` before it (SEMANTICS 1)."""
    line = line[:-1] if line.endswith(b"\n") else line
    return line[:-1] if line.endswith(b"\r") else line


def _definition(text: str) -> dict:
    """Return the definition (of a subscription or a target) given as JSON text or ``@FILE``."""
    raw = Path(text[1:]).read_text("utf-8") if text.startswith("@") else text
    try:
        definition = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the definition is not JSON: {exc}") from None
    if not isinstance(definition, dict):
        raise ConfigError('the definition is a JSON object: {"kind": ..., ...}')
    return definition
