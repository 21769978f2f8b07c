"""Page cursors: opaque, and good only for the tenant and the list they were given for.

A cursor carries a position in the ledger's global order (a task's ``seq``). Given in the
clear, two cursors would tell a tenant how many tasks every tenant created between them; so
the position is encrypted with AES-SIV under the deployment's cursor key (kept in the ledger,
the same for every process), with the tenant and the list's name as associated data: a
cursor altered, made up, or issued to another tenant or for another list does not decrypt.
"""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

#: the ledger's name for the key (64 bytes: AES-256-SIV)
KEY_NAME = "cursors"
KEY_BYTES = 64
_PREFIX = "c2-"
_POSITION_BYTES = 8


class CursorRefused(ValueError):
    """The cursor was not issued by this deployment to this tenant for this list."""


class Cursors:
    """Encrypts and reads the cursors of one deployment (one key)."""

    def __init__(self, key: bytes) -> None:
        self._siv = AESSIV(key)

    def encode(self, tenant: str, listing: str, position: int) -> str:
        sealed = self._siv.encrypt(
            position.to_bytes(_POSITION_BYTES, "big"), [tenant.encode(), listing.encode()]
        )
        return _PREFIX + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii")

    def decode(self, tenant: str, listing: str, cursor: str) -> int:
        """The position ``cursor`` holds; :class:`CursorRefused` for any other string."""
        if not cursor.isascii() or not cursor.startswith(_PREFIX):
            raise CursorRefused(cursor)
        body = cursor.removeprefix(_PREFIX)
        try:
            sealed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            plain = self._siv.decrypt(sealed, [tenant.encode(), listing.encode()])
        except (binascii.Error, InvalidTag, ValueError):
            raise CursorRefused(cursor) from None
        if len(plain) != _POSITION_BYTES:
            raise CursorRefused(cursor)
        return int.from_bytes(plain, "big")
