"""The errors scriba raises at its callers, one class per thing that went wrong."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "IdentityOverride",
    "InvalidState",
    "ProjectionBusy",
    "ProjectionNameWarning",
    "ScribaError",
    "StartFailed",
    "UnknownProjection",
]


class ScribaError(Exception):
    """Base class of the errors scriba raises (not of :class:`~scriba.target.ApplyFailed`,
    which targets raise at the engine)."""


class ConfigError(ScribaError, ValueError):
    """A projection's options are missing or invalid (raised when the class is defined,
    or when it is started)."""


class IdentityOverride(ConfigError):  # noqa: N818 - names what was attempted
    """``start`` was given ``name`` or ``version``: identity belongs to the class."""


class InvalidState(ScribaError):  # noqa: N818 - reads as "invalid state: paused"
    """A lifecycle call does not apply to the projection's current state.

    Attributes:
        state: the state the projection was in (a :class:`~scriba.coordinator.Status`).
    """

    def __init__(self, state: object, message: str) -> None:
        super().__init__(message)
        self.state = state


class ProjectionBusy(ScribaError):  # noqa: N818 - reads as "projection busy"
    """The projection's lock is held (by another process, or another runtime of this
    one), so what needed it exclusively, a reset, was refused and changed nothing."""


class UnknownProjection(ScribaError, LookupError):  # noqa: N818 - reads as a lookup failure
    """No projection of that name and version was started in this runtime."""


class StartFailed(ScribaError):  # noqa: N818 - names the outcome
    """The projection's pipeline could not get going (its source did not subscribe, its
    target did not open); the projection is left stopped. ``__cause__`` says why."""


class ProjectionNameWarning(UserWarning):
    """A projection name ends like ``_v2``: the version belongs in ``version``, or the
    two versions will not be recognised as one projection."""
