"""ISO 8601 durations as configuration spells them: ``PnDTnHnMnS`` (``"PT30S"``,
``"P3D"``, ``"PT0.5S"``), read into a :class:`~datetime.timedelta`.

>>> iso_duration("PT1M30S")
datetime.timedelta(seconds=90)
>>> iso_duration("P1M")
Traceback (most recent call last):
...
ValueError: 'P1M' is not a duration of the form PnDTnHnMnS
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

__all__ = ["iso_duration"]

_DURATION: Final = re.compile(
    r"P(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


def iso_duration(text: object) -> timedelta:
    """``text``, an ISO 8601 duration of the form ``PnDTnHnMnS``, as a timedelta.

    Raises:
        ValueError: any other form (years, months, weeks, a sign, nothing at all).
    """
    found = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if found is None or text in ("P", "PT") or str(text).endswith("T"):
        raise ValueError(f"{text!r} is not a duration of the form PnDTnHnMnS")
    parts = {name: float(value) for name, value in found.groupdict().items() if value}
    return timedelta(**parts)
