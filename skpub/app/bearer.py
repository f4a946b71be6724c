"""The daemon's bearer token, read the same way by ``skpub serve`` and by the client verbs.

Kept apart from :mod:`skpub.app.serve` so that a client verb (``skpub
subscribe``, ``skpub follow`` ...) does not import the daemon, its engines
and the balancer only to read a token: the CLI starts in half the time.
"""

from __future__ import annotations

import os

from skpub.kernel.errors import ConfigError

TOKEN_ENV = "SKPUB_TOKEN"
"""The environment variable holding the token when no ``--token-file`` is given."""
MAX_TOKEN_BYTES = 4096
"""Longest token file read, bytes; a longer one is refused, not read to its end."""


def load_token(token_file: str | None) -> str | None:
    """Return the bearer token from ``token_file`` (its first line) or ``$SKPUB_TOKEN``, or None.

    At most ``MAX_TOKEN_BYTES + 1`` bytes of the file are read.

    Raises
    ------
    ConfigError
        If the file is empty, too long or not text.
    OSError
        If the file cannot be read.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    with open(token_file, "rb") as fh:
        raw = fh.read(MAX_TOKEN_BYTES + 1)
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {token_file}: the token is printable ASCII") from None
    if not token or len(raw) > MAX_TOKEN_BYTES or not token.isprintable() or " " in token:
        raise ConfigError(f"--token-file {token_file}: one printable token of at most {MAX_TOKEN_BYTES} bytes")
    return token
