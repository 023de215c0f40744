"""The blob codec: the one seam every stored blob of durable executions crosses.

:class:`~statifier.persistence.Storage` hands every blob it writes to its codec's
``encode`` before the adapter sees it, and every blob the adapter returns to ``decode``
before anything else does. The blobs are the payloads a host's data can reach: the
position of an execution and of a saved position (the datamodel), the outcome of a
finished execution (its donedata), each entry of the input log (the events, their data
included) and the chart's source. The columns things are looked up by stay plain: ids,
content hashes, statuses, failures, the metadata map, the input log's ``seq`` and
``via``, and every time; the identity guard, the unique keys and the listings read them
back verbatim.

The default, :data:`PLAIN`, stores blobs as they are. An encrypting codec is
:class:`statifier.persistence.fernet.FernetCodec` (extra ``crypto``); any object with
the two methods of :class:`BlobCodec` serves.

A JSON column (the router's timer payloads, the event of an outbox row) holds an
encoded document as a JSON object of one key, :data:`SEALED`, whose value is the encoded
bytes in base64: :func:`sealed_json` writes that form, :func:`opened_json` and
:func:`opened_text` read it, and all three leave a document alone under :data:`PLAIN`.

>>> class Reversed:
...     def encode(self, blob: bytes) -> bytes:
...         return blob[::-1]
...     def decode(self, blob: bytes) -> bytes:
...         return blob[::-1]
>>> codec: BlobCodec = Reversed()
>>> codec.decode(codec.encode(b"datamodel"))
b'datamodel'
>>> PLAIN.encode(b"datamodel")
b'datamodel'
>>> stored = sealed_json(codec, '{"card": "4111"}')
>>> stored
'{"statifier.sealed": "fSIxMTE0IiA6ImRyYWMiew=="}'
>>> opened_json(codec, stored, "a timer")
{'card': '4111'}
>>> opened_json(PLAIN, stored, "a timer")
Traceback (most recent call last):
...
statifier.persistence.codec.UndecodableBlob: a timer is encoded, and no codec was given
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol

from statifier.persistence.errors import PersistenceError
from statifier.sealed import SEALED, is_sealed, sealed_blob, sealed_document

__all__ = [
    "PLAIN",
    "SEALED",
    "BlobCodec",
    "PlainBlobs",
    "UndecodableBlob",
    "opened_json",
    "opened_text",
    "sealed_json",
]


class BlobCodec(Protocol):
    """Turns a blob into what is stored, and back.

    Contract: ``decode(encode(blob)) == blob`` for every ``bytes`` value, the empty one
    included; ``encode`` may answer different bytes each time for the same blob (a
    random nonce), so nothing may compare encoded blobs. Both are called on the event
    loop, inside the transaction of the call that stores or reads the blob: they must
    not block on I/O.
    """

    def encode(self, blob: bytes) -> bytes:
        """What to store for ``blob``."""
        ...

    def decode(self, stored: bytes) -> bytes:
        """The blob ``stored`` was encoded from.

        Raises:
            UndecodableBlob: ``stored`` was not encoded by this codec (or by none of its
                keys), or was altered since.
        """
        ...


class PlainBlobs:
    """The identity codec: blobs are stored exactly as given. Use :data:`PLAIN`."""

    def encode(self, blob: bytes) -> bytes:
        return blob

    def decode(self, stored: bytes) -> bytes:
        return stored

    def __repr__(self) -> str:
        return "PLAIN"


PLAIN: Final = PlainBlobs()
"""The default codec: nothing encoded."""


class UndecodableBlob(PersistenceError):  # noqa: N818 - names the refusal
    """A stored blob could not be decoded: written under a key no longer configured,
    by another codec, or altered in the database. Nothing was changed.

    The message names what the blob belongs to (an execution id, a chart hash, a saved
    position's key) and never a key or the blob's bytes.
    """


def sealed_json(codec: BlobCodec, text: str) -> str:
    """The JSON text to store for the JSON text ``text``: itself under :data:`PLAIN`,
    else ``{"statifier.sealed": base64 of codec.encode(text)}``.

    >>> sealed_json(PLAIN, '{"card": "4111"}')
    '{"card": "4111"}'
    """
    if isinstance(codec, PlainBlobs):
        return text
    return json.dumps(sealed_document(codec.encode(text.encode("utf-8"))))


def opened_text(codec: BlobCodec, stored: str, what: str) -> str:
    """The JSON text :func:`sealed_json` was given, from the text it returned: ``stored``
    itself under :data:`PLAIN`, else its sealed form decoded. A sealed text under
    :data:`PLAIN`, or a plain one under another codec, is refused: one table holds one
    codec's documents.

    Raises:
        UndecodableBlob: naming ``what`` the text belongs to.

    >>> opened_text(PLAIN, '["tick"]', "an outbox row")
    '["tick"]'
    """
    if isinstance(codec, PlainBlobs):
        if stored.startswith(_SEALED_PREFIX):
            raise UndecodableBlob(f"{what} is encoded, and no codec was given")
        return stored
    try:
        document = json.loads(stored)
    except ValueError:  # not even JSON: damaged, or written by something else
        raise UndecodableBlob(f"{what} is not in the encoded form") from None
    return _unsealed(codec, document, what)


def opened_json(codec: BlobCodec, stored: Any, what: str) -> Any:
    """The document ``stored`` holds (as the driver read it: parsed, or JSON text),
    decoded from its sealed form unless the codec is :data:`PLAIN`; refused as
    :func:`opened_text` refuses.

    Raises:
        UndecodableBlob: naming ``what`` the document belongs to.

    >>> opened_json(PLAIN, '{"card": "4111"}', "a timer")
    {'card': '4111'}
    """
    document = json.loads(stored) if isinstance(stored, (str, bytes)) else stored
    if isinstance(codec, PlainBlobs):
        if is_sealed(document):
            raise UndecodableBlob(f"{what} is encoded, and no codec was given")
        return document
    return json.loads(_unsealed(codec, document, what))


_SEALED_PREFIX: Final = f'{{"{SEALED}": '
"""How :func:`sealed_json`'s text starts (``json.dumps`` of a one-key object)."""


def _unsealed(codec: BlobCodec, document: Any, what: str) -> str:
    """The JSON text sealed in ``document``."""
    try:
        blob = sealed_blob(document)
    except ValueError:
        raise UndecodableBlob(f"{what} is not in the encoded form") from None
    if blob is None:
        raise UndecodableBlob(f"{what} is not encoded: it was stored without the codec")
    try:
        return codec.decode(blob).decode("utf-8")
    except UndecodableBlob as failure:
        raise UndecodableBlob(f"{what} could not be decoded: {failure}") from None
    except UnicodeDecodeError:
        raise UndecodableBlob(f"{what} does not decode to JSON text") from None
