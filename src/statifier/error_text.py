"""An error told in one string: its class and its message, as ``last_error`` columns,
log lines and telemetry give it.

A leaf: it imports nothing of the project, and any layer may use it.

>>> error_text(TimeoutError())
'TimeoutError'
>>> error_text(ValueError("no such queue"))
'ValueError: no such queue'
>>> error_text(ValueError("x" * 50), most=20)
'ValueError: xxxxxxx…'
"""

from __future__ import annotations

__all__ = ["error_text"]


def error_text(error: BaseException, most: int | None = None) -> str:
    """``"Class: message"`` of ``error`` (the class alone when the message is empty),
    cut to at most ``most`` characters with an ellipsis when ``most`` is given."""
    message = str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    if most is None or len(text) <= most:
        return text
    return f"{text[: most - 1]}…"
