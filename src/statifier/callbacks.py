"""Host callbacks may be plain functions or coroutines: one helper takes either answer.

>>> import asyncio
>>> async def later() -> int:
...     return 2
>>> asyncio.run(awaited(1)), asyncio.run(awaited(later()))
(1, 2)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["awaited"]

T = TypeVar("T")


async def awaited(answer: T | Awaitable[T]) -> T:
    """``answer`` itself, or what it gives when awaited if it is awaitable: call a host
    callback, then ``await awaited(result)``."""
    if inspect.isawaitable(answer):
        return await answer
    return answer
