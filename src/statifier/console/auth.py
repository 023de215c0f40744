"""Who may use the console: operators, their roles, the session cookie and CSRF.

An operator is configured by name with a login token (read from an environment
variable, never written in a file) and a :class:`Role`: ``operator`` reads every page
and acts (cancel, retry, discard, rotate); ``read_only`` reads every page and acts on
nothing. The login form posts the token; a match (compared in constant time against
every operator's) starts a session: a cookie signed with HMAC-SHA256 under a key that
is random per process unless one is configured (so a restart logs everyone out).

The cookie carries the operator's name, when it was issued, a fingerprint of the
operator's token, and the session's CSRF token; it is ``HttpOnly``,
``SameSite=Strict`` and scoped to the console's path (``Secure`` when configured). A
cookie is honoured only while its signature holds, it is younger than
:attr:`Sessions.max_age`, its operator is still configured and its token fingerprint
still matches (a changed token ends the sessions made with the old one). The role is
read from the configuration on every request, never from the cookie.

Every action form carries the session's CSRF token; :meth:`Session.csrf_ok` checks
it on POST (in constant time).

>>> operators = Operators([Operator("ada", "a" * 32, Role.OPERATOR)])
>>> sessions = Sessions(operators, key=b"k" * 32)
>>> cookie = sessions.issue(operators.authenticate("a" * 32))
>>> session = sessions.read(cookie)
>>> session.operator.name, session.may_act, session.csrf_ok(session.csrf)
('ada', True, True)
>>> sessions.read(cookie[:-2] + "xx") is None
True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

__all__ = [
    "COOKIE",
    "MIN_TOKEN_LENGTH",
    "Operator",
    "OperatorError",
    "Operators",
    "Role",
    "Session",
    "Sessions",
]

COOKIE: Final = "statifier_console"
"""The session cookie's name."""
MIN_TOKEN_LENGTH: Final = 16
"""The shortest login token accepted: shorter ones are guessable."""
MAX_TOKEN_LENGTH: Final = 512
"""The longest login token accepted (a posted one is not hashed past this)."""
DEFAULT_MAX_AGE: Final = 12 * 3600.0
"""How long a session lasts by default: 12 hours."""
KEY_BYTES: Final = 32


class OperatorError(ValueError):
    """An operator the console refuses: an empty or duplicate name, a token that is
    too short, an unknown role. The message never carries the token."""


class Role(StrEnum):
    """What an operator may do."""

    OPERATOR = "operator"
    """Read every page and act."""
    READ_ONLY = "read_only"
    """Read every page; every action is refused (403)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One operator: ``name`` (shown in the audit table), ``token`` (kept out of
    ``repr``) and ``role``.

    Raises:
        OperatorError: an empty name, a token shorter than :data:`MIN_TOKEN_LENGTH`
            or longer than :data:`MAX_TOKEN_LENGTH`, a role that is not a
            :class:`Role`.
    """

    name: str
    token: str = field(repr=False)
    role: Role = Role.READ_ONLY

    def __post_init__(self) -> None:
        name: object = self.name
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise OperatorError(f"an operator's name is 1 to 200 characters, not {name!r}")
        token: object = self.token
        if not isinstance(token, str) or not MIN_TOKEN_LENGTH <= len(token) <= MAX_TOKEN_LENGTH:
            raise OperatorError(
                f"operator {self.name!r}: the token must be {MIN_TOKEN_LENGTH} to "
                f"{MAX_TOKEN_LENGTH} characters"
            )
        role: object = self.role
        if not isinstance(role, Role):
            try:
                object.__setattr__(self, "role", Role(str(role)))
            except ValueError:
                roles = ", ".join(r.value for r in Role)
                raise OperatorError(
                    f"operator {name!r}: the role must be one of {roles}, not {role!r}"
                ) from None

    @property
    def fingerprint(self) -> str:
        """A short digest of the token, kept in the cookie so that a changed token
        ends the old sessions (it reveals nothing usable of the token)."""
        digest = hashlib.sha256(b"statifier.console.session\x00" + self.token.encode())
        return digest.hexdigest()[:32]


class Operators:
    """The configured operators, looked up by token or by name.

    Raises:
        OperatorError: two operators with one name or one token.
    """

    def __init__(self, operators: Iterable[Operator]) -> None:
        self._by_name: dict[str, Operator] = {}
        digests: set[bytes] = set()
        for operator in operators:
            if operator.name in self._by_name:
                raise OperatorError(f"two operators are named {operator.name!r}")
            digest = _digest(operator.token)
            if digest in digests:
                raise OperatorError(f"operator {operator.name!r} shares a token with another")
            digests.add(digest)
            self._by_name[operator.name] = operator
        self._digests = [(_digest(o.token), o) for o in self._by_name.values()]

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[Operator]:
        return iter(self._by_name.values())

    @property
    def names(self) -> tuple[str, ...]:
        """The operators' names, in configuration order."""
        return tuple(self._by_name)

    def named(self, name: str) -> Operator | None:
        """The operator called ``name``, if configured."""
        return self._by_name.get(name)

    def authenticate(self, token: str) -> Operator | None:
        """The operator whose token is ``token``, or ``None``. Every configured token
        is compared (in constant time, on digests), so the time taken does not tell
        which operator, if any, came close."""
        given: object = token
        if not isinstance(given, str) or not given or len(given) > MAX_TOKEN_LENGTH:
            return None
        posted = _digest(token)
        found: Operator | None = None
        for digest, operator in self._digests:
            if hmac.compare_digest(digest, posted):
                found = operator
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in operator, as one request's cookie proved.

    Attributes:
        operator: who (with the role configured now).
        csrf: the token every action form of this session carries.
        issued: when the session began (seconds since the epoch).
    """

    operator: Operator
    csrf: str = field(repr=False)
    issued: float

    @property
    def may_act(self) -> bool:
        """Whether this operator may act (the ``operator`` role)."""
        return self.operator.role is Role.OPERATOR

    def csrf_ok(self, posted: object) -> bool:
        """Whether ``posted`` (a form's ``csrf`` field) is this session's token."""
        return isinstance(posted, str) and hmac.compare_digest(
            posted.encode("utf-8"), self.csrf.encode("utf-8")
        )


class Sessions:
    """Issues and reads the signed session cookie.

    Args:
        operators: who may sign in.
        key: the signing key (at least 32 bytes); random per process by default.
        max_age: the seconds a session lasts.
        secure: whether the cookie is marked ``Secure`` (sent over HTTPS only).
        path: the cookie's path (the console's mount point).
        clock: seconds since the epoch (``time.time``), for tests.

    Raises:
        OperatorError: a key shorter than 32 bytes, a ``max_age`` that is not positive.
    """

    def __init__(
        self,
        operators: Operators,
        *,
        key: bytes | None = None,
        max_age: float = DEFAULT_MAX_AGE,
        secure: bool = False,
        path: str = "/console",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if key is not None and len(key) < KEY_BYTES:
            raise OperatorError(f"the session key must be at least {KEY_BYTES} bytes")
        if not max_age > 0:
            raise OperatorError(f"a session's max_age must be positive, not {max_age!r}")
        self.operators = operators
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        self.max_age = max_age
        self.secure = secure
        self.path = path
        self.clock = clock

    def issue(self, operator: Operator | None) -> str:
        """The cookie value of a new session of ``operator`` (with a fresh CSRF token).

        Raises:
            OperatorError: ``operator`` is ``None`` or not configured.
        """
        if operator is None or self.operators.named(operator.name) is not operator:
            raise OperatorError("no such operator")
        payload = {
            "op": operator.name,
            "fp": operator.fingerprint,
            "iat": self.clock(),
            "csrf": secrets.token_urlsafe(24),
        }
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{_b64(self._sign(body))}"

    def read(self, cookie: str | None) -> Session | None:
        """The session ``cookie`` proves, or ``None`` (missing, forged, expired, or
        its operator gone or given a new token)."""
        if not cookie or len(cookie) > 4096 or cookie.count(".") != 1:
            return None
        body, _, signature = cookie.partition(".")
        try:
            given = _unb64(signature)
            if not hmac.compare_digest(given, self._sign(body)):
                return None
            payload = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(payload, dict):
            return None
        name, fingerprint, issued, csrf = (payload.get(k) for k in ("op", "fp", "iat", "csrf"))
        if not (
            isinstance(name, str)
            and isinstance(fingerprint, str)
            and isinstance(issued, int | float)
            and isinstance(csrf, str)
        ):
            return None
        age = self.clock() - float(issued)
        if not 0 <= age < self.max_age:
            return None
        operator = self.operators.named(name)
        if operator is None or not hmac.compare_digest(operator.fingerprint, fingerprint):
            return None
        return Session(operator, csrf, float(issued))

    def cookie_attributes(self) -> dict[str, object]:
        """The attributes of the cookie (for ``Response.set_cookie``)."""
        return {
            "max_age": int(self.max_age),
            "path": self.path,
            "httponly": True,
            "samesite": "strict",
            "secure": self.secure,
        }

    def _sign(self, body: str) -> bytes:
        return hmac.new(self._key, body.encode("ascii"), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as error:
        raise ValueError("not base64") from error
