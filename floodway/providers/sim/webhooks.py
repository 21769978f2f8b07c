"""Job-completion callbacks signed the Standard Webhooks way (webhook-id, webhook-timestamp,
webhook-signature = ``v1,`` + base64 HMAC-SHA256 over ``{id}.{timestamp}.{body}``)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx

from floodway.wire.signing import signed_headers

logger = logging.getLogger("floodway.simulator")


def signed_request(
    secret: str, msg_id: str, payload: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """The exact body bytes and headers of one callback; the signature covers those bytes."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        **signed_headers(secret, msg_id, timestamp, body),
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
