"""How a target sends delivery lines, one class per kind (:data:`SENDERS`): webhook, MQTT, NATS, Redis Streams.

A sender takes a batch of ``(offset, subscription id, line)`` in offset
order and returns once the destination has taken every one of them, or
raises; the target's thread (:mod:`skpub.app.targets`) retries the batch
whole with backoff and moves its cursor only after a send returned. So
every kind is at least once and in offset order; each message carries its
offset for the consumer to de-duplicate on (SEMANTICS section 7):

- **webhook** (httpx): one ``POST`` of ``{"deliveries": [line, ...]}``;
  2xx is taken; ``X-Skpub-Signature: sha256=<hex>`` is the HMAC-SHA256 of
  the body under the target's secret, when it has one.
- **mqtt** (paho-mqtt): each line is published with QoS 1 to ``topic``
  (``{sub}`` is the subscription id) and counts once the broker's PUBACK
  came.
- **nats** (nats-py): each line is published to JetStream on ``subject``
  (a batch in waves, one line of each subscription per wave, each wave's
  acknowledgements awaited together) with the header
  ``Nats-Msg-Id: <data directory id>/<target>/<offset>``,
  so the server drops a resend within its duplicate window and nothing
  else; a stream named after the subject is created if no stream holds it.
- **redis** (redis-py): ``XADD`` to ``stream`` with the id
  ``<offset>-0`` and fields ``offset`` and ``line``; a resend is refused by
  Redis (its id is not above the stream's last) and counts as taken once
  the stream is read back holding that very line at that id, so a Redis
  stream holds each line once; any other refusal (the stream written by
  something else) is a failed send, reported, never a silent skip. Two
  targets of one daemon may not write the same stream.

In a topic, subject or stream name ``{sub}`` becomes the subscription id
with every character but letters, digits, ``_`` and ``-`` written ``_``
(the line carries the exact id).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import httpx

if TYPE_CHECKING:
    from skpub.app.targets import TargetSpec

Batch = list[tuple[int, str, bytes]]
"""``(offset, subscription id, line)`` of the lines to send, in offset order."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class SendFailed(Exception):
    """The destination did not take a batch (the sentence says why)."""


def channel(template: str, sid: str) -> str:
    """Return the topic, subject or stream name ``template`` for subscription ``sid``."""
    return template.replace("{sub}", _UNSAFE.sub("_", sid) or "_")


class WebhookSender:
    """``POST {"deliveries": [...]}`` to the target's URL (module docstring)."""

    def __init__(self, spec: TargetSpec, secret: bytes | None, _instance: str) -> None:
        self.spec, self.secret = spec, secret
        self.http = httpx.Client(timeout=spec.timeout)

    def send(self, batch: Batch) -> None:
        """POST the batch; raises :class:`SendFailed` unless the answer is 2xx."""
        body = b'{"deliveries":[' + b",".join(line for _, _, line in batch) + b"]}"
        headers = {"Content-Type": "application/json", "X-Skpub-Target": self.spec.name}
        if self.secret is not None:
            headers["X-Skpub-Signature"] = "sha256=" + hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        try:
            response = self.http.post(self.spec.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise SendFailed(f"{type(exc).__name__}: {exc}") from None
        if not response.is_success:
            raise SendFailed(f"{response.status_code} {response.reason_phrase}")

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


class MqttSender:
    """Publish each line with QoS 1 to ``topic`` (module docstring)."""

    def __init__(self, spec: TargetSpec, _secret: bytes | None, instance: str) -> None:
        import paho.mqtt.client as mqtt

        self.spec = spec
        where = urlsplit(spec.url)
        # at most 23 bytes (what every MQTT 3.1.1 broker takes), unique per data directory and target
        client_id = "skpub" + hashlib.sha256(f"{instance}/{spec.name}".encode()).hexdigest()[:18]
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        if where.username is not None:
            self.client.username_pw_set(unquote(where.username), unquote(where.password or ""))
        self.client.connect(where.hostname or "127.0.0.1", where.port or 1883, keepalive=30)
        self.client.loop_start()

    def send(self, batch: Batch) -> None:
        """Publish every line and wait for the broker's acknowledgements."""
        sent = [self.client.publish(channel(self.spec.topic, sid), line, qos=1) for _, sid, line in batch]
        for info in sent:
            if info.rc != 0:
                raise SendFailed(f"MQTT publish refused (rc {info.rc})")
            info.wait_for_publish(self.spec.timeout)
            if not info.is_published():
                raise SendFailed(f"no MQTT acknowledgement within {self.spec.timeout} s")

    def close(self) -> None:
        """Disconnect."""
        self.client.loop_stop()
        self.client.disconnect()


class NatsSender:
    """Publish each line to JetStream on ``subject`` with ``Nats-Msg-Id: <offset>`` (module docstring)."""

    def __init__(self, spec: TargetSpec, _secret: bytes | None, instance: str) -> None:
        self.spec, self.instance = spec, instance
        self.nc = None
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(asyncio.wait_for(self._connect(), spec.timeout * 2))
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        import nats
        from nats.js.errors import NotFoundError

        self.nc = await nats.connect(
            self.spec.url, connect_timeout=self.spec.timeout, allow_reconnect=False, max_reconnect_attempts=0
        )
        self.js = self.nc.jetstream(timeout=self.spec.timeout)
        subject = self.spec.subject.replace("{sub}", "*")
        try:
            await self.js.find_stream_name_by_subject(self.spec.subject.replace("{sub}", "x"))
        except NotFoundError:  # a stream named after its subjects: a redefinition or another target finds it
            name = "skpub-" + hashlib.sha256(subject.encode()).hexdigest()[:16]
            await self.js.add_stream(name=name, subjects=[subject])

    def send(self, batch: Batch) -> None:
        """Publish every line and wait for JetStream's acknowledgements."""
        try:
            self.loop.run_until_complete(self._publish(batch))
        except Exception as exc:  # noqa: BLE001 - any failure of the client is a send that did not happen
            raise SendFailed(f"{type(exc).__name__}: {exc}") from None

    async def _publish(self, batch: Batch) -> None:
        """Publish the batch in waves: the first line of each subscription, then the second, ...

        A wave's lines (one per subscription) go without waiting between
        them, and the next wave only once every one of the wave's was
        acknowledged: a subscription's line is never sent before its earlier
        one was taken, so a refused line is not overtaken by a later line of
        its subscription (offset order per subscription, SEMANTICS 7); other
        subscriptions' lines may go ahead of it, as order across
        subscriptions is not promised. One round trip per wave, not per line.
        """
        timeout = self.spec.timeout
        for wave in _waves(batch):
            acks = []
            for offset, sid, line in wave:  # the id names this data directory's target too: no other one collides
                headers = {"Nats-Msg-Id": f"{self.instance}/{self.spec.name}/{offset}"}
                subject = channel(self.spec.subject, sid)
                acks.append(await self.js.publish_async(subject, line, wait_stall=timeout, headers=headers))
            answers = await asyncio.wait_for(asyncio.gather(*acks, return_exceptions=True), timeout)
            refused = next((a for a in answers if isinstance(a, BaseException)), None)
            if refused is not None:
                raise refused

    def close(self) -> None:
        """Close the connection (within the timeout) and the event loop."""
        try:
            if self.nc is not None:
                self.loop.run_until_complete(asyncio.wait_for(self.nc.close(), self.spec.timeout))
        except Exception:  # noqa: BLE001, S110 - a broken connection is being dropped anyway
            pass
        finally:
            self.loop.close()


def _waves(batch: Batch) -> list[Batch]:
    """Split a batch into waves: wave ``i`` holds the ``i``-th line of each subscription, in offset order."""
    waves: list[Batch] = []
    seen: dict[str, int] = {}
    for entry in batch:
        i = seen.get(entry[1], 0)
        seen[entry[1]] = i + 1
        if i == len(waves):
            waves.append([])
        waves[i].append(entry)
    return waves


class RedisSender:
    """``XADD`` each line to ``stream`` with the id ``<offset>-0`` (module docstring)."""

    def __init__(self, spec: TargetSpec, _secret: bytes | None, _instance: str) -> None:
        import redis

        self.spec = spec
        self.redis = redis.Redis.from_url(spec.url, socket_timeout=spec.timeout, socket_connect_timeout=spec.timeout)
        self.redis.ping()

    def send(self, batch: Batch) -> None:
        """Add every line; one Redis already holds (a resend) counts as taken."""
        import redis

        pipe = self.redis.pipeline(transaction=False)
        for offset, sid, line in batch:
            pipe.xadd(channel(self.spec.stream, sid), {"offset": offset, "line": line}, id=f"{offset}-0")
        try:
            results = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            raise SendFailed(f"{type(exc).__name__}: {exc}") from None
        for (offset, sid, line), result in zip(batch, results, strict=True):
            if isinstance(result, Exception) and not self._holds(channel(self.spec.stream, sid), offset, line):
                raise SendFailed(f"XADD of offset {offset} refused: {result}")

    def _holds(self, stream: str, offset: int, line: bytes) -> bool:
        """Whether ``stream`` holds this very line at the id ``<offset>-0`` (a resend), not another one."""
        entries = self.redis.xrange(stream, min=f"{offset}-0", max=f"{offset}-0")
        return bool(entries) and entries[0][1] == {b"offset": str(offset).encode(), b"line": line}

    def close(self) -> None:
        """Close the connection pool."""
        self.redis.close()


SENDERS = {"webhook": WebhookSender, "mqtt": MqttSender, "nats": NatsSender, "redis": RedisSender}
"""The sender of each target kind."""

SCHEMES = {"webhook": ("http", "https"), "mqtt": ("mqtt",), "nats": ("nats",), "redis": ("redis", "rediss")}
"""The URL schemes each kind takes."""

CHANNELS = {"mqtt": ("topic", "skpub/deliveries/{sub}"), "nats": ("subject", "skpub.deliveries.{sub}"),
            "redis": ("stream", "skpub:deliveries")}  # fmt: skip
"""The field naming each kind's destination inside its server, and its default."""
