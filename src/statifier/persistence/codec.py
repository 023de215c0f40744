"""The blob codec: the one seam every stored blob of durable executions crosses.

:class:`~statifier.persistence.Storage` hands every blob it writes to its codec's
``encode`` before the adapter sees it, and every blob the adapter answers to ``decode``
before anything else does. The blobs are the payloads a host's data can reach: the
position of an execution and of a saved position (the datamodel), the outcome of a
finished execution (its donedata), each entry of the input log (the events, their data
included) and the chart's source. The columns things are looked up by stay plain: ids,
content hashes, statuses, failures, the metadata map, the input log's ``seq`` and
``door``, and every time; the identity guard, the unique keys and the listings read them
back verbatim.

The default, :data:`PLAIN`, stores blobs as they are. An encrypting codec is
:class:`statifier.persistence.fernet.FernetCodec` (extra ``crypto``); any object with
the two methods of :class:`BlobCodec` serves.

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
"""

from __future__ import annotations

from typing import Final, Protocol

from statifier.persistence.errors import PersistenceError

__all__ = ["PLAIN", "BlobCodec", "PlainBlobs", "UndecodableBlob"]


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
