"""API keys looked up in constant time per request, and still timing-safe.

Each configured key is kept as its HMAC-SHA256 under a secret drawn when the table is built.
A presented key's digest finds its entry by a prefix of the digest in a dict, and the whole
digest is then compared with :func:`hmac.compare_digest`. What a dict probe's timing could
show (how much of a prefix matched) is about a digest the caller cannot compute without the
secret: it tells nothing about any key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

#: bytes of the digest that pick the entries to compare: 2**64 values, collisions (handled)
#: practically never happen
_PREFIX = 8


@dataclass(frozen=True)
class KeyOwner:
    tenant: str
    #: an ``[api] admin_keys`` key: its tenant's operator
    operator: bool


class KeyTable:
    def __init__(self, keys: Mapping[str, str], admin_keys: Mapping[str, str]) -> None:
        self._secret = secrets.token_bytes(32)
        self._entries: dict[bytes, list[tuple[bytes, KeyOwner]]] = {}
        operators = {key: KeyOwner(tenant, True) for key, tenant in admin_keys.items()}
        # An operator key listed among the plain keys too acts as the operator.
        owners = {key: KeyOwner(tenant, False) for key, tenant in keys.items()} | operators
        for key, owner in owners.items():
            digest = self._digest(key)
            self._entries.setdefault(digest[:_PREFIX], []).append((digest, owner))

    def _digest(self, key: str) -> bytes:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).digest()

    def owner(self, presented: str) -> KeyOwner | None:
        """Whose key ``presented`` is (None: no configured key)."""
        digest = self._digest(presented)
        found = None
        for stored, owner in self._entries.get(digest[:_PREFIX], ()):
            if hmac.compare_digest(stored, digest):
                found = owner
        return found
