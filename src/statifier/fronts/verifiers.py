"""Verifying a posted request before anything of it is routed.

A :class:`Verifier` is the host's: it is handed the request and its raw body, and
returns whether the post is authentic. The webhook and form fronts run it first, on
every POST, and answer 401 to a refusal without routing anything. :func:`hmac_sha256`
builds the verifier of the common provider scheme: an HMAC-SHA256 of the body (and,
optionally, a timestamp) under a shared secret, sent in a header.

>>> import hashlib, hmac
>>> from starlette.requests import Request
>>> body = b'{"id": "evt_1"}'
>>> signature = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
>>> verify = hmac_sha256(b"s3cret", header="x-signature", prefix="sha256=")
>>> def post(value: str) -> Request:
...     headers = [(b"x-signature", value.encode())]
...     return Request({"type": "http", "method": "POST", "headers": headers})
>>> verify(post("sha256=" + signature), body), verify(post("sha256=" + "0" * 64), body)
(True, False)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["SignedMessage", "Verifier", "hmac_sha256", "timestamp_dot_body"]


class Verifier(Protocol):
    """Whether a posted request is authentic: ``(request, raw_body) -> bool``, or an
    awaitable of one. It must not read the body from the request (it is read already);
    an exception it raises answers 500, and nothing is routed either way."""

    def __call__(self, request: Request, body: bytes, /) -> bool | Awaitable[bool]: ...


SignedMessage = Callable[[str | None, bytes], bytes]
"""``(timestamp, raw_body) -> the bytes the provider signed``; the timestamp is the
timestamp header's value, or ``None`` when none is read."""


def timestamp_dot_body(timestamp: str | None, body: bytes) -> bytes:
    """The timestamp, ``.``, the body (the body alone without a timestamp): what most
    providers that sign a timestamp sign."""
    return body if timestamp is None else timestamp.encode("ascii") + b"." + body


def hmac_sha256(
    secret: bytes,
    *,
    header: str,
    encoding: Literal["hex", "base64"] = "hex",
    prefix: str = "",
    timestamp_header: str | None = None,
    tolerance: float = 300.0,
    signed: SignedMessage = timestamp_dot_body,
    clock: Callable[[], float] = time.time,
) -> Verifier:
    """A verifier of an HMAC-SHA256 signature under ``secret``.

    Args:
        secret: the shared secret (non-empty).
        header: the header the signature is sent in.
        encoding: how the signature is written: ``hex`` (either case) or ``base64``.
        prefix: text before the signature in the header (``"sha256="``), required.
        timestamp_header: a header holding the signing time in Unix seconds; given,
            a post whose time is more than ``tolerance`` seconds from ``clock()``
            either way is refused (a replayed old post), and the timestamp is signed.
        signed: the bytes signed, from the timestamp and the body
            (:func:`timestamp_dot_body` by default).
        clock: the current Unix time.

    The signature is compared in constant time. A missing or undecodable header
    refuses the post.

    Raises:
        ValueError: an empty secret or header name, an unknown encoding, or a
            tolerance that is not positive.
    """
    given: object = secret
    if not isinstance(given, bytes) or not given:
        raise ValueError("an HMAC secret is non-empty bytes")
    if not header:
        raise ValueError("name the header the signature is sent in")
    if encoding not in ("hex", "base64"):
        raise ValueError(f"a signature is hex or base64, not {encoding!r}")
    if timestamp_header is not None and not tolerance > 0:
        raise ValueError(f"the timestamp tolerance is positive seconds, not {tolerance!r}")

    def verify(request: Request, body: bytes) -> bool:
        sent = _signature(request.headers.get(header), prefix, encoding)
        if sent is None:
            return False
        timestamp = None
        if timestamp_header is not None:
            timestamp = request.headers.get(timestamp_header)
            if timestamp is None or not _recent(timestamp, tolerance, clock()):
                return False
        expected = hmac.new(secret, signed(timestamp, body), hashlib.sha256).digest()
        return hmac.compare_digest(expected, sent)

    return verify


def _signature(value: str | None, prefix: str, encoding: str) -> bytes | None:
    """The signature bytes a header carries, or ``None``."""
    if value is None or not value.startswith(prefix):
        return None
    text = value[len(prefix) :].strip()
    try:
        if encoding == "hex":
            return bytes.fromhex(text)
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return None


def _recent(timestamp: str, tolerance: float, now: float) -> bool:
    # isdigit() alone takes digits int() refuses ("²", a header's latin-1 byte 0xB2).
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        return False
    return abs(now - int(timestamp)) <= tolerance
