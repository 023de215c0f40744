"""Host callbacks may be plain functions or coroutines: one helper takes either answer.

>>> import asyncio
>>> async def later() -> int:
...     return 2
>>> asyncio.run(settle(1)), asyncio.run(settle(later()))
(1, 2)
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["settle"]

T = TypeVar("T")


async def settle(answer: T | Awaitable[T]) -> T:
    """``answer`` itself, or what it gives when awaited if it is awaitable: call a host
    callback, then ``await settle(result)``."""
    if inspect.isawaitable(answer):
        return await answer
    return answer
