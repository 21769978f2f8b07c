"""Standard Webhooks signatures (https://www.standardwebhooks.com) for outbound callbacks.

``webhook-signature`` is ``v1,`` + base64(HMAC-SHA256(secret, f"{id}.{timestamp}.{body}")),
computed over the exact body bytes; the secret's UTF-8 bytes are the HMAC key. (Inbound
callbacks are verified by :func:`floodway.providers.webhook_in.verify_signature`.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }
