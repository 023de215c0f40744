"""A projection: a class whose ``handle`` turns events into writes, with its options.

A user subclasses :class:`Projection`, names it, points it at a source and a target and
implements ``handle(event, meta)``, returning an operation (``Insert``, ``Update``,
``Delete``, ``Execute``, ``Multi``), ``Skip()`` or ``Error(reason)``. Raising counts as
``Error``. ``handle`` may be a plain method or ``async def``.

>>> from scriba.operations import Skip
>>> class Orders(Projection):
...     name = "orders"
...     def handle(self, event, meta):
...         return Skip()
>>> Orders.key()
ProjectionKey(name='orders', version=1)
>>> Orders.retry
RetryPolicy(max_attempts=3, backoff=(0.1, 1.0, 10.0))
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeAlias, cast

from scriba.errors import ConfigError, IdentityOverride, ProjectionNameWarning
from scriba.event import Event, Meta, ProjectionKey
from scriba.operations import Result
from scriba.source import Source
from scriba.target import Target

__all__ = [
    "Projection",
    "RetryPolicy",
    "Settings",
    "SourceOption",
    "TargetOption",
    "is_factory",
    "settings_of",
]

SourceOption: TypeAlias = Source | Callable[[], Source]
"""A source, or a function making one (called for every pipeline run, so a restart
gets a fresh subscription)."""

TargetOption: TypeAlias = Target | Callable[[], Target]
"""A target, or a function making one (called once per runtime, which then closes it)."""

_LEGACY_VERSION_SUFFIX = re.compile(r"_v\d+$")
_OVERRIDABLE = (
    "source",
    "target",
    "parallelism",
    "retry",
    "batch_size",
    "batch_timeout",
    "lag_interval",
    "start_from",
    "commit_backoff",
    "drain_timeout",
    "max_restarts",
    "restart_window",
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing handler is called before its event is dead-lettered.

    ``backoff`` holds the sleeps between attempts, in seconds, so ``max_attempts``
    attempts need ``max_attempts - 1`` of them; extra entries are unused. A sleep blocks
    only the partition of the failing event.

    >>> RetryPolicy(max_attempts=2, backoff=(0.5,)).delay_before(2)
    0.5
    >>> RetryPolicy.never()
    RetryPolicy(max_attempts=1, backoff=())
    >>> RetryPolicy(max_attempts=4, backoff=(0.1,))
    Traceback (most recent call last):
    ...
    scriba.errors.ConfigError: 4 attempts need 3 backoff entries, got 1
    """

    max_attempts: int = 3
    backoff: tuple[float, ...] = (0.1, 1.0, 10.0)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"max_attempts is an int, not {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts is 1 or more, not {self.max_attempts}")
        backoff = tuple(self.backoff)
        if any(not _is_number(delay) or delay < 0 for delay in backoff):
            raise ConfigError(f"backoff holds non-negative seconds, not {self.backoff!r}")
        object.__setattr__(self, "backoff", tuple(float(delay) for delay in backoff))
        if len(backoff) < self.max_attempts - 1:
            raise ConfigError(
                f"{self.max_attempts} attempts need {self.max_attempts - 1} backoff entries,"
                f" got {len(backoff)}"
            )

    @classmethod
    def never(cls) -> RetryPolicy:
        """One attempt: a failing handler's event is dead-lettered at once."""
        return cls(max_attempts=1, backoff=())

    def delay_before(self, attempt: int) -> float:
        """The sleep before attempt number ``attempt`` (2 or more)."""
        return self.backoff[attempt - 2]


@dataclass(frozen=True, slots=True)
class Settings:
    """A projection's options as one run uses them: the class attributes with the
    overrides given to ``start`` applied, validated."""

    key: ProjectionKey
    source: SourceOption
    target: TargetOption
    parallelism: int
    retry: RetryPolicy
    batch_size: int
    batch_timeout: float
    lag_interval: float
    start_from: int | None
    commit_backoff: tuple[float, ...]
    drain_timeout: float
    max_restarts: int = 5
    restart_window: float = 60.0

    def with_overrides(self, overrides: Mapping[str, Any]) -> Settings:
        """These settings with ``overrides`` applied and checked.

        Raises:
            IdentityOverride: ``name`` or ``version`` is among them.
            ConfigError: an unknown option, or an invalid value.
        """
        identity = {"name", "version"} & set(overrides)
        if identity:
            raise IdentityOverride(
                f"{' and '.join(sorted(identity))} cannot be overridden at start: a "
                "projection's identity is its class (declare a new class with version=2)"
            )
        unknown = set(overrides) - set(_OVERRIDABLE)
        if unknown:
            raise ConfigError(f"unknown projection options: {', '.join(sorted(unknown))}")
        changes = dict(overrides)
        if "retry" in changes:
            changes["retry"] = _retry_policy(changes["retry"])
        return _checked(replace(self, **changes))


class Projection:
    """Subclass this, set the options as class attributes and implement :meth:`handle`.

    Options:
        name: the projection's name (required); with ``version`` its identity.
        version: an int, 1 by default; a new version runs beside the old one with
            cursors, watermark and dead letters of its own.
        source: a :class:`~scriba.source.Source`, or a function making one.
        target: a :class:`~scriba.target.Target`, or a function making one.
        parallelism: how many partitions run at once (1); events of one stream always
            go to the same partition, in order.
        retry: a :class:`RetryPolicy` for failing handlers; ``None`` means one attempt.
        batch_size: events per commit at most (100).
        batch_timeout: seconds a partition waits to fill a batch before committing
            what it has (0.1).
        lag_interval: seconds between ``scriba.projection.lag`` events (1.0; 0 disables).
        start_from: read the source after this position instead of after the stored
            watermark (``None``: resume where the projection left off).
        commit_backoff: seconds to wait before replaying a batch whose commit failed
            transiently, attempt by attempt; the last entry repeats.
        drain_timeout: seconds ``stop`` waits for the partitions to finish the events
            they are on and commit (30.0); then it cancels them, and what they had not
            committed is delivered again on the next start.
        max_restarts: how many times a crashed pipeline is started again within
            ``restart_window`` seconds (5); the crash after that halts the projection,
            with the crash as its ``halt_reason``. 0 halts on the first crash.
        restart_window: seconds over which restarts are counted (60.0).

    A name ending like ``_v2`` draws a :class:`~scriba.errors.ProjectionNameWarning`.

    Raises:
        ConfigError: when the class is defined with an invalid option value.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    source: ClassVar[SourceOption | None] = None
    target: ClassVar[TargetOption | None] = None
    parallelism: ClassVar[int] = 1
    retry: ClassVar[RetryPolicy | None] = RetryPolicy()
    batch_size: ClassVar[int] = 100
    batch_timeout: ClassVar[float] = 0.1
    lag_interval: ClassVar[float] = 1.0
    start_from: ClassVar[int | None] = None
    commit_backoff: ClassVar[tuple[float, ...]] = (0.1, 0.5, 2.0, 5.0)
    drain_timeout: ClassVar[float] = 30.0
    max_restarts: ClassVar[int] = 5
    restart_window: ClassVar[float] = 60.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A class without a name may be a shared base; its subclasses are checked then.
        if "name" not in cls.__dict__:
            return
        name: object = cls.__dict__["name"]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{cls.__qualname__}.name must be a non-empty str")
        if _LEGACY_VERSION_SUFFIX.search(name):
            warnings.warn(
                f"projection name {name!r} ends with a version suffix; set version "
                "instead, so that versions share one name",
                ProjectionNameWarning,
                stacklevel=2,
            )
        settings_of(cls, require_endpoints=False)

    @classmethod
    def key(cls) -> ProjectionKey:
        """The projection's identity: ``(name, version)``.

        Raises:
            ConfigError: the class has no name.
        """
        name = cls.__dict__.get("name", getattr(cls, "name", None))
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{cls.__qualname__} has no name: set name = '...'")
        try:
            return ProjectionKey(name, cls.version)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{cls.__qualname__}: {exc}") from None

    def handle(self, event: Event, meta: Meta) -> Result | Awaitable[Result]:
        """Turn one event into what to write. Override it.

        Return an operation, ``Skip()`` or ``Error(reason)``; raising counts as an error.
        The handler must not write anywhere itself: scriba applies what it returns in
        the transaction that also moves the stream's cursor.
        """
        raise NotImplementedError(f"{type(self).__qualname__} does not implement handle")


def settings_of(
    projection: type[Projection],
    overrides: Mapping[str, Any] | None = None,
    *,
    require_endpoints: bool = True,
) -> Settings:
    """Validated settings of ``projection``, with ``overrides`` applied.

    Raises:
        ConfigError: a missing name, source or target (when ``require_endpoints``),
            ``handle`` not implemented, or an invalid option.
        IdentityOverride: ``overrides`` names ``name`` or ``version``.
    """
    candidate: object = projection
    if not (isinstance(candidate, type) and issubclass(candidate, Projection)):
        raise ConfigError(f"expected a Projection subclass, got {projection!r}")
    placeholder: Any = _Missing.VALUE
    settings = Settings(
        key=projection.key(),
        source=projection.source if projection.source is not None else placeholder,
        target=projection.target if projection.target is not None else placeholder,
        parallelism=projection.parallelism,
        retry=_retry_policy(projection.retry),
        batch_size=projection.batch_size,
        batch_timeout=projection.batch_timeout,
        lag_interval=projection.lag_interval,
        start_from=projection.start_from,
        commit_backoff=tuple(projection.commit_backoff),
        drain_timeout=projection.drain_timeout,
        max_restarts=projection.max_restarts,
        restart_window=projection.restart_window,
    )
    settings = _checked(settings)
    if overrides:
        settings = settings.with_overrides(overrides)
    if require_endpoints:
        for option in ("source", "target"):
            if getattr(settings, option) is _Missing.VALUE:
                raise ConfigError(f"projection {settings.key.name!r} has no {option}")
        if projection.handle is Projection.handle:
            raise ConfigError(f"{projection.__qualname__} does not implement handle")
    return settings


class _Missing:
    VALUE: ClassVar[Any] = object()


def is_factory(option: object, protocol_method: str) -> bool:
    """Whether a ``source``/``target`` option is a factory to call rather than the thing
    itself: a class, or a callable without the protocol's ``protocol_method``."""
    return isinstance(option, type) or (callable(option) and not hasattr(option, protocol_method))


def made_target(option: object) -> tuple[Target, bool]:
    """The target a ``target`` option gives, and whether it was made by this call (a
    factory called: the caller then owns it and closes it)."""
    if is_factory(option, "apply_batch"):
        return cast(Callable[[], Target], option)(), True
    return cast(Target, option), False


def made_source(option: object) -> Source:
    """The source a ``source`` option gives, made by this call if it is a factory."""
    if is_factory(option, "read"):
        return cast(Callable[[], Source], option)()
    return cast(Source, option)


def _checked(settings: Settings) -> Settings:
    name = settings.key.name
    if not _is_int(settings.parallelism) or settings.parallelism < 1:
        raise ConfigError(f"{name}: parallelism is an int >= 1, not {settings.parallelism!r}")
    if not _is_int(settings.batch_size) or settings.batch_size < 1:
        raise ConfigError(f"{name}: batch_size is an int >= 1, not {settings.batch_size!r}")
    if not _is_number(settings.batch_timeout) or settings.batch_timeout <= 0:
        raise ConfigError(f"{name}: batch_timeout is seconds > 0, not {settings.batch_timeout!r}")
    if not _is_number(settings.lag_interval) or settings.lag_interval < 0:
        raise ConfigError(f"{name}: lag_interval is seconds >= 0, not {settings.lag_interval!r}")
    if settings.start_from is not None and (
        not _is_int(settings.start_from) or settings.start_from < 0
    ):
        raise ConfigError(f"{name}: start_from is a position >= 0, not {settings.start_from!r}")
    if not _is_number(settings.drain_timeout) or settings.drain_timeout < 0:
        raise ConfigError(f"{name}: drain_timeout is seconds >= 0, not {settings.drain_timeout!r}")
    if not _is_int(settings.max_restarts) or settings.max_restarts < 0:
        raise ConfigError(f"{name}: max_restarts is an int >= 0, not {settings.max_restarts!r}")
    if not _is_number(settings.restart_window) or settings.restart_window <= 0:
        raise ConfigError(f"{name}: restart_window is seconds > 0, not {settings.restart_window!r}")
    backoff = settings.commit_backoff
    if not backoff or any(not _is_number(delay) or delay < 0 for delay in backoff):
        raise ConfigError(f"{name}: commit_backoff is non-empty seconds >= 0, not {backoff!r}")
    return settings


def _retry_policy(value: object) -> RetryPolicy:
    if value is None or value is False:
        return RetryPolicy.never()
    if isinstance(value, RetryPolicy):
        return value
    raise ConfigError(f"retry is a RetryPolicy or None, not {value!r}")
