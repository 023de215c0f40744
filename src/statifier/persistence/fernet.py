"""Blobs encrypted at rest with Fernet, with key rotation (extra ``crypto``).

:class:`FernetCodec` is a :class:`~statifier.persistence.codec.BlobCodec`: it encrypts
with the first (newest) of its keys and decrypts with whichever of them a blob was
encrypted with, so rotating is a matter of putting a new key first, and later dropping
an old one once nothing stored under it is still read. Fernet is AES-128 in CBC mode with
an HMAC-SHA256 over the whole token: a blob altered in the database fails to decode
rather than decoding to something else.

>>> key = FernetCodec.generate_key()
>>> codec = FernetCodec([key])
>>> token = codec.encode(b'{"card": "4111 1111 1111 1111"}')
>>> b"4111" in token
False
>>> codec.decode(token)
b'{"card": "4111 1111 1111 1111"}'
>>> FernetCodec([FernetCodec.generate_key()]).decode(token)
Traceback (most recent call last):
...
statifier.persistence.codec.UndecodableBlob: not a Fernet token of any configured key

Keys are secrets: nothing here puts a key in a message, a ``repr`` or a log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from statifier.extras import MissingExtra
from statifier.persistence.codec import UndecodableBlob

try:
    from cryptography.fernet import Fernet, InvalidToken, MultiFernet
except ModuleNotFoundError as missing:  # cryptography: the crypto extra
    raise MissingExtra.of(missing) from missing

__all__ = ["FernetCodec", "FernetKeyError"]


class FernetKeyError(ValueError):
    """A key that is not a Fernet key, or a key variable that is unset or empty. The
    message says which one (its place in the list, or the variable's name), never its
    value."""


class FernetCodec:
    """Encrypts with the first key, decrypts with any.

    Args:
        keys: Fernet keys (32 random bytes, url-safe base64: what
            :meth:`generate_key` makes), as ``str`` or ``bytes``, the newest first. At
            least one.

    Raises:
        FernetKeyError: no key, or one that is not a Fernet key.

    ``encode`` returns a fresh token each time (a random IV and the time of encryption,
    which this codec does not check: a stored blob has no expiry). ``decode`` raises
    :class:`~statifier.persistence.codec.UndecodableBlob` for a token none of the keys
    made, or one altered since.
    """

    __slots__ = ("_fernet", "_keys")

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if isinstance(keys, (str, bytes)) or not keys:
            raise FernetKeyError("give a list of one or more Fernet keys, the newest first")
        count = len(keys)
        fernets = [_fernet(key, f"key {place + 1} of {count}") for place, key in enumerate(keys)]
        self._keys = len(fernets)
        self._fernet = MultiFernet(fernets)

    @classmethod
    def from_env(
        cls, names: Sequence[str], environ: Mapping[str, str] | None = None
    ) -> FernetCodec:
        """The codec of the keys held by the environment variables ``names``, the
        newest first (``environ``: ``os.environ`` if ``None``).

        Raises:
            FernetKeyError: no names, a variable unset or empty, or one whose value is
                not a Fernet key (the message names the variable).
        """
        if isinstance(names, str) or not names:
            raise FernetKeyError("name one or more environment variables, the newest key first")
        source = os.environ if environ is None else environ
        keys: list[str] = []
        for name in names:
            value = source.get(name, "")
            if not value.strip():
                raise FernetKeyError(f"the environment variable {name} holds no Fernet key")
            keys.append(value.strip())
        for name, key in zip(names, keys, strict=True):
            _fernet(key, f"the key in {name}")  # to name the variable, not a place
        return cls(keys)

    @staticmethod
    def generate_key() -> str:
        """A new random Fernet key, as text to keep in a secret store."""
        return Fernet.generate_key().decode("ascii")

    def encode(self, blob: bytes) -> bytes:
        """``blob`` encrypted with the newest key."""
        return self._fernet.encrypt(blob)

    def decode(self, stored: bytes) -> bytes:
        """``stored`` decrypted with whichever key made it.

        Raises:
            UndecodableBlob: no configured key made it, or it was altered.
        """
        try:
            return self._fernet.decrypt(stored)
        except InvalidToken:
            raise UndecodableBlob("not a Fernet token of any configured key") from None

    def rotate(self, stored: bytes) -> bytes:
        """``stored`` encrypted again with the newest key (for a host re-encrypting
        rows of its own before it drops an old key).

        Raises:
            UndecodableBlob: no configured key made it, or it was altered.
        """
        try:
            return self._fernet.rotate(stored)
        except InvalidToken:
            raise UndecodableBlob("not a Fernet token of any configured key") from None

    def __repr__(self) -> str:
        return f"FernetCodec(<{self._keys} key{'s' if self._keys != 1 else ''}>)"


def _fernet(key: str | bytes, which: str) -> Fernet:
    if not isinstance(key, (str, bytes)):
        raise FernetKeyError(f"{which} is a str or bytes, not {type(key).__name__}")
    try:
        return Fernet(key)
    except (ValueError, TypeError):
        # cryptography's message does not echo the key, but say it in our words.
        raise FernetKeyError(
            f"{which} is not a Fernet key (32 bytes in url-safe base64, as "
            "FernetCodec.generate_key() makes)"
        ) from None
