"""Who may call the HTTP API: bearer tokens, each for some scopes, to read or to write.

A token is compared in constant time against every configured one (on SHA-256
digests, so the time taken tells nothing of which token came close), and never appears
in a log line, a ``repr`` or an answer.

>>> tokens = ApiTokens([ApiToken("partner", "p" * 24, ("acme",), Rights.WRITE)])
>>> found = tokens.authenticate("p" * 24)
>>> found.name, found.may("acme", Rights.WRITE), found.may("globex", Rights.READ)
('partner', True, False)
>>> tokens.authenticate("q" * 24) is None
True
>>> found
ApiToken(name='partner', scopes=('acme',), rights=<Rights.WRITE: 'write'>)
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

__all__ = [
    "ALL_SCOPES",
    "MAX_TOKEN_LENGTH",
    "MIN_TOKEN_LENGTH",
    "ApiToken",
    "ApiTokenError",
    "ApiTokens",
    "Rights",
]

MIN_TOKEN_LENGTH: Final = 16
"""The shortest token accepted: shorter ones are guessable."""
MAX_TOKEN_LENGTH: Final = 512
"""The longest token accepted (a presented one is not hashed past this)."""
ALL_SCOPES: Final = "*"
"""The scope that stands for every scope."""


class ApiTokenError(ValueError):
    """A token the API refuses to configure: an empty or duplicate name, a token too
    short or too long or shared with another, no scopes. The message never carries the
    token."""


class Rights(StrEnum):
    """What a token may do in its scopes."""

    READ = "read"
    """Read executions, list them, wait on them."""
    WRITE = "write"
    """Read, and send events and cancel."""


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One caller of the API.

    Attributes:
        name: who it is (in the audit rows of what it does, and in log lines).
        token: the secret it presents as ``Authorization: Bearer <token>``; kept out
            of ``repr``.
        scopes: the scopes it reaches; ``("*",)`` reaches every scope.
        rights: :class:`Rights`.

    Raises:
        ApiTokenError: an empty name, a token outside
            ``MIN_TOKEN_LENGTH..MAX_TOKEN_LENGTH`` characters, no scope or an empty
            one, rights that are not a :class:`Rights`.
    """

    name: str
    token: str = field(repr=False)
    scopes: tuple[str, ...]
    rights: Rights = Rights.READ

    def __post_init__(self) -> None:
        name: object = self.name
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ApiTokenError(f"an API token's name is 1 to 200 characters, not {name!r}")
        token: object = self.token
        if not isinstance(token, str) or not MIN_TOKEN_LENGTH <= len(token) <= MAX_TOKEN_LENGTH:
            raise ApiTokenError(
                f"API token {name!r}: the token must be {MIN_TOKEN_LENGTH} to "
                f"{MAX_TOKEN_LENGTH} characters"
            )
        scopes: object = self.scopes
        if (
            not isinstance(scopes, tuple)
            or not scopes
            or not all(isinstance(s, str) and s for s in scopes)
        ):
            raise ApiTokenError(f"API token {name!r}: scopes is a non-empty list of scopes")
        rights: object = self.rights
        if not isinstance(rights, Rights):
            try:
                object.__setattr__(self, "rights", Rights(str(rights)))
            except ValueError:
                raise ApiTokenError(
                    f"API token {name!r}: rights is 'read' or 'write', not {rights!r}"
                ) from None

    @property
    def every_scope(self) -> bool:
        """Whether it reaches every scope."""
        return ALL_SCOPES in self.scopes

    def reaches(self, scope: str) -> bool:
        """Whether ``scope`` is one of its scopes."""
        return self.every_scope or scope in self.scopes

    def may(self, scope: str, rights: Rights) -> bool:
        """Whether it may do what ``rights`` names in ``scope``."""
        allowed = rights is Rights.READ or self.rights is Rights.WRITE
        return allowed and self.reaches(scope)


class ApiTokens:
    """The configured tokens, looked up by the token presented.

    Raises:
        ApiTokenError: two tokens with one name, or one token under two names.
    """

    def __init__(self, tokens: Iterable[ApiToken]) -> None:
        names: set[str] = set()
        self._digests: list[tuple[bytes, ApiToken]] = []
        for token in tokens:
            if token.name in names:
                raise ApiTokenError(f"two API tokens are named {token.name!r}")
            digest = _digest(token.token)
            if any(digest == known for known, _ in self._digests):
                raise ApiTokenError(f"API token {token.name!r} shares its token with another")
            names.add(token.name)
            self._digests.append((digest, token))

    def __len__(self) -> int:
        return len(self._digests)

    def __iter__(self) -> Iterator[ApiToken]:
        return (token for _, token in self._digests)

    def authenticate(self, presented: str) -> ApiToken | None:
        """The token whose secret is ``presented``, or ``None``. Every configured
        token is compared, in constant time, on digests."""
        given: object = presented
        if not isinstance(given, str) or not given or len(given) > MAX_TOKEN_LENGTH:
            return None
        posted = _digest(presented)
        found: ApiToken | None = None
        for digest, token in self._digests:
            if hmac.compare_digest(digest, posted):
                found = token
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
