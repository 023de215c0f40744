"""``merged_page``, the console's list over several stores, as a property: whatever
each store's rows and their order (a store may order text as its collation says, not
as Python does), walking the pages from the first shows every store's rows exactly
once, each store's in its own order, at most ``size`` a page and never an empty page
before the last; in either direction."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hypothesis import given
from hypothesis import strategies as st

from statifier.console.queries import Page
from statifier.console.shards import Order, merged_page

_ROWS = st.lists(st.text(alphabet="aAbB_-é", min_size=1, max_size=3), max_size=12)


def _reader(rows: list[str], size: int) -> Callable[[str | None], Awaitable[Page[str]]]:
    """A store listing ``rows`` in their given order, ``size`` a page; its cursor is
    the last row listed."""

    async def read(after: str | None) -> Page[str]:
        start = 0 if after is None else rows.index(after) + 1
        page = rows[start : start + size]
        more = start + size < len(rows)
        return Page(tuple(page), page[-1] if more else None)

    return read


@given(
    stores=st.lists(_ROWS, min_size=1, max_size=4),
    size=st.integers(min_value=1, max_value=5),
    newest_first=st.booleans(),
)
def test_walking_the_pages_shows_every_stores_rows_once_in_its_order(
    stores: list[list[str]], size: int, newest_first: bool
) -> None:
    # Rows unique across the stores (an address, a row id, lives in one store).
    stores = [
        [f"{number}:{row}" for row in dict.fromkeys(rows)] for number, rows in enumerate(stores)
    ]
    order = Order("rows", lambda row: row.split(":", 1)[1], lambda row: row, newest_first)
    readers = [_reader(rows, size) for rows in stores]

    async def walk() -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
        pages = []
        cursor: str | None = None
        while True:
            page, numbers = await merged_page(order, readers, cursor, size)
            pages.append((page.rows, numbers))
            if page.next_cursor is None:
                return pages
            cursor = page.next_cursor

    pages = asyncio.run(walk())
    total = sum(len(rows) for rows in stores)
    assert all(len(rows) <= size for rows, _ in pages)
    assert all(rows for rows, _ in pages[:-1])  # no empty page before the last
    assert len(pages) <= max(1, -(-total // size)) + 1
    shown = [row for rows, _ in pages for row in rows]
    for number, rows in enumerate(stores):
        assert [row for row in shown if row.startswith(f"{number}:")] == rows
    assert len(shown) == total
    for listed, numbers in pages:
        assert [int(row.split(":", 1)[0]) for row in listed] == list(numbers)
