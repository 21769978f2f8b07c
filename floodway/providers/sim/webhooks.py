"""Job-completion callbacks signed the Standard Webhooks way (webhook-id, webhook-timestamp,
webhook-signature = ``v1,`` + base64 HMAC-SHA256 over ``{id}.{timestamp}.{body}``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from typing import Any

import httpx

logger = logging.getLogger("floodway.simulator")


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one message."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_request(
    secret: str, msg_id: str, payload: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """The exact body bytes and headers of one callback; the signature covers those bytes."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_webhook(secret, msg_id, timestamp, body),
    }
    return body, headers


async def deliver(
    client: httpx.AsyncClient, url: str, secret: str, msg_id: str, payload: dict[str, Any]
) -> bool:
    """POST one callback; True if the receiver answered 2xx. Failures are logged, never raised:
    a provider does not retry forever, and the scheduler must cope with a lost callback."""
    body, headers = signed_request(secret, msg_id, payload)
    try:
        response = await client.post(url, content=body, headers=headers)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        logger.warning("webhook %s to %s failed: %s", msg_id, url, exc)
        return False
    if not response.is_success:
        logger.warning("webhook %s to %s answered %d", msg_id, url, response.status_code)
        return False
    return True
