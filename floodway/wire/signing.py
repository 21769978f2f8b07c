"""Standard Webhooks signatures (https://www.standardwebhooks.com), both ways: floodway signs
the callbacks it sends (the outbox, the simulated provider) and verifies the ones providers
send it.

``webhook-signature`` is ``v1,`` + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")) over the
exact body bytes. The key is the secret's UTF-8 bytes, or its base64 decoding when it has the
``whsec_`` prefix (the form Standard Webhooks libraries generate).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

from floodway.core.errors import FloodwayError


class WebhookSignatureError(FloodwayError):
    """The callback is not provably from the provider (answer it 401, do not apply it)."""


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """The ``webhook-signature`` value of one message."""
    return "v1," + _digest(_key(secret, strict=False), msg_id, timestamp, body)


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, now: float, tolerance_s: float = 300
) -> None:
    """Raise :class:`WebhookSignatureError` unless ``body`` is signed with ``secret`` and its
    timestamp is within ``tolerance_s`` of ``now`` (replays of old messages are refused)."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise WebhookSignatureError(
            "missing webhook-id, webhook-timestamp or webhook-signature header"
        )
    try:
        sent_at = int(stamp)
    except ValueError:
        raise WebhookSignatureError(f"webhook-timestamp {stamp!r} is not a number") from None
    if abs(now - sent_at) > tolerance_s:
        raise WebhookSignatureError(
            f"webhook-timestamp is {now - sent_at:+.0f}s from now (tolerance {tolerance_s:g}s)"
        )
    expected = _digest(_key(secret), msg_id, sent_at, body).encode()
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        # Compared as bytes: a header may carry any byte, and compare_digest refuses non-ASCII
        # text (that was a 500 for a forged header; it is a mismatch like any other).
        if version == "v1" and hmac.compare_digest(value.encode("utf-8", "replace"), expected):
            return
    raise WebhookSignatureError("no webhook-signature matches the body")


def _digest(key: bytes, msg_id: str, timestamp: int | str, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def _key(secret: str, *, strict: bool = True) -> bytes:
    """Verifying, a ``whsec_`` secret that is not base64 is a configuration error worth naming;
    signing with one (an API key that happens to start so), its bytes are the key."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            if strict:
                raise WebhookSignatureError("the whsec_ secret is not valid base64") from None
    return secret.encode()
