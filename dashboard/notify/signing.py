"""Standard Webhooks signatures (https://www.standardwebhooks.com), implemented here.

A channel's secret is ``whsec_`` followed by the base64 of 32 random bytes. Each request carries

- ``webhook-id``: the notification's ``message_id``, identical on every retry, so a receiver can
  drop duplicates;
- ``webhook-timestamp``: Unix seconds when this attempt was signed (receivers reject old ones);
- ``webhook-signature``: ``v1,`` + base64(HMAC-SHA256(secret bytes, ``id.timestamp.body``)).

Any Standard Webhooks library verifies these, e.g. Python's
``standardwebhooks.webhooks.Webhook(secret).verify(body, headers)``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time

__all__ = ["SECRET_PREFIX", "new_secret", "secret_bytes", "sign", "signature_headers"]

SECRET_PREFIX = "whsec_"
_SECRET_BYTES = 32  # 256 bits, the key size of HMAC-SHA256


def new_secret() -> str:
    """A fresh random channel secret in the ``whsec_<base64>`` form receivers expect."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(_SECRET_BYTES)).decode("ascii")


def secret_bytes(secret: str) -> bytes:
    """The HMAC key inside ``secret``; ValueError when it is not ``whsec_`` + base64."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the webhook secret is not whsec_ followed by base64") from None
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one request: ``v1,<base64 HMAC-SHA256>``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_headers(
    secret: str, message_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``, signed now unless ``timestamp`` given."""
    at = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(at),
        "webhook-signature": sign(secret, message_id, at, body),
    }
