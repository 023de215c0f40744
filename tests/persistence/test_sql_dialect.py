"""The storage layer's dialects and the timers table's statements, on both databases:
one statement text, bound by name, converted and run alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statifier.persistence.sql import SqlAdapter
from statifier.sql.dialect import named_to_pyformat, utc_text, utc_time
from statifier.sql.timers import TimerTable

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
PLAIN = st.text(alphabet="abc ,()=<>'%0123456789", max_size=12)


@given(st.lists(st.tuples(PLAIN, NAMES), max_size=6), PLAIN)
def test_every_parameter_is_bound_by_name_and_every_percent_sign_kept(
    parts: list[tuple[str, str]], tail: str
) -> None:
    text = "".join(f"{plain} :{name} " for plain, name in parts) + tail
    bound = named_to_pyformat(text)
    assert re.findall(r"%\((\w+)\)s", bound) == [name for _, name in parts]
    # What psycopg reads back once it has bound the names is the text with values.
    assert re.sub(r"%\(\w+\)s", "?", bound).replace("%%", "%") == re.sub(
        r"(?<![:\w]):[a-z_]\w*", "?", text
    )


def test_casts_and_times_in_literals_are_not_parameters() -> None:
    assert named_to_pyformat("SELECT :a::jsonb, '10:30', x::int") == (
        "SELECT %(a)s::jsonb, '10:30', x::int"
    )


@given(st.datetimes(timezones=st.just(UTC)))
def test_a_stored_time_reads_back_as_it_was(value: datetime) -> None:
    assert utc_time(utc_text(value)) == value


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        utc_text(datetime(2026, 1, 1))  # noqa: DTZ001 - the naive time refused


START = datetime(2026, 12, 2, 12, tzinfo=UTC)


async def _insert(table: TimerTable, driver: object, send_id: str, due_in: int) -> None:
    await table.insert(
        driver,
        execution_id="x",
        send_id=send_id,
        dedup_key=f"x/{send_id}",
        kind="external",
        due_at=START + timedelta(seconds=due_in),
        step_position=0,
        payload='{"n": 1}',
        now=START,
    )


@pytest.mark.asyncio
async def test_the_timers_statements_read_alike_on_both_databases(
    sql_adapter: SqlAdapter,
) -> None:
    table = TimerTable(sql_adapter.tables, sql_adapter.dialect)
    async with sql_adapter.transaction() as tx:
        for send_id, due_in in (("late", 30), ("first", 1), ("second", 2), ("first", 5)):
            await _insert(table, tx.driver, send_id, due_in)  # "first" twice: one row
        assert await table.next_due(tx.driver) == START + timedelta(seconds=1)
        pending = await table.of_execution(tx.driver, "x", 10)
        assert [row.send_id for row in pending] == ["first", "second", "late"]
        assert all(row.due_at.tzinfo is not None for row in pending)

        claimed = await table.claim(tx.driver, START + timedelta(seconds=10), 10)
        assert [(row.send_id, row.locked) for row in claimed] == [
            ("first", True),
            ("second", True),
        ]
        await table.move(tx.driver, claimed[1].id, START + timedelta(seconds=60))

        taken = await table.take_due(tx.driver, START + timedelta(seconds=10), 10)
        assert [row.send_id for row in taken.rows] == ["first"]
        assert taken.upcoming == START + timedelta(seconds=30)
        assert taken.rows[0].payload in ('{"n": 1}', {"n": 1})
        assert not await table.delete(tx.driver, taken.rows[0].id)  # already taken

        assert await table.delete_send(tx.driver, "x", "late") == 1
        assert await table.upcoming(tx.driver, START) == START + timedelta(seconds=60)
        assert await table.delete(tx.driver, claimed[1].id)
        assert await table.next_due(tx.driver) is None
