"""The sealed form of a JSON document: how a JSON column holds a blob codec's output.

A document stored encoded is a JSON object of one key, :data:`SEALED`, whose value is
the encoded bytes in base64. Writing and reading it under a codec is
:mod:`statifier.persistence.codec`'s (``sealed_json``, ``opened_json``); rewriting it
under a new key, without reading what it holds, is :func:`statifier.sql.blobs.
rewrite_blobs`'s. This module is the form alone, so both can share it: it imports
nothing of the library.

>>> document = sealed_document(b"\\x00\\x01")
>>> document
{'statifier.sealed': 'AAE='}
>>> sealed_blob(document)
b'\\x00\\x01'
>>> sealed_blob({"card": "4111"}) is None
True
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

__all__ = ["SEALED", "is_sealed", "sealed_blob", "sealed_document"]

SEALED: Final = "statifier.sealed"
"""The one key of a JSON document stored encoded."""


def sealed_document(blob: bytes) -> dict[str, str]:
    """The document that holds the encoded ``blob``."""
    return {SEALED: base64.b64encode(blob).decode("ascii")}


def is_sealed(document: Any) -> bool:
    """Whether ``document`` (parsed) has the sealed form's shape."""
    return isinstance(document, dict) and len(document) == 1 and SEALED in document


def sealed_blob(document: Any) -> bytes | None:
    """The encoded blob a sealed ``document`` (parsed) holds; ``None`` for any other
    document.

    Raises:
        ValueError: the document has the sealed form's one key, but no base64 blob.
    """
    if not is_sealed(document):
        return None
    try:
        return base64.b64decode(document[SEALED], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ValueError("a sealed document holds no base64 blob") from None
