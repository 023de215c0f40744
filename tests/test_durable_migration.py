"""`Durable.migrate` and `Durable.migrate_all`: executions of a named chart moved onto
the revision now given under that name, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.persistence.conftest import drop_schema, unique_name

from statifier.durable import (
    Durable,
    InvalidMigrationPlan,
    MigrationSummary,
    Status,
    UnknownChart,
)
from statifier.sql import TableOptions

NS = 'xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"'
ORDER_V1 = (
    f'<scxml {NS} initial="placed"><datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paid">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="paid"><transition event="hold" target="held"/>'
    '<transition event="ship" target="shipped"/></state>'
    '<state id="held"/><final id="shipped"/></scxml>'
)
ORDER_V2 = (
    f'<scxml {NS} initial="placed"><datamodel><data id="n" expr="0"/>'
    '<data id="carrier" expr="null"/></datamodel>'
    '<state id="placed"><transition event="pay" target="charged">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="charged"><transition event="ship" target="shipped"/></state>'
    '<final id="shipped"/></scxml>'
)
HELD = "active state 'held' is not in the new chart and the plan maps it nowhere"


@pytest.fixture(params=("sqlite", "postgresql"))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, TableOptions]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'durable.db'}", TableOptions(prefix="m_")
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_migrate_")
    try:
        yield url, TableOptions(prefix="m_", schema=schema)
    finally:
        drop_schema(url, schema)


@pytest.mark.asyncio
async def test_executions_move_to_the_revision_given_under_their_name(
    where: tuple[str, TableOptions],
) -> None:
    url, tables = where
    async with Durable(url, charts={"order": ORDER_V1}, tables=tables, migrate=True) as old:
        for i, events in enumerate([(), ("pay",), ("pay", "hold"), ("pay", "ship")]):
            await old.create("order", f"o{i}")
            for event in events:
                await old.send(f"o{i}", event)
    async with Durable(url, charts={"order": ORDER_V2}, tables=tables) as new:
        one = await new.migrate("o1", state_map={"paid": "charged"}, data={"carrier": "post"})
        assert (one.migrated, one.status, one.configuration) == (True, Status.ACTIVE, ("charged",))
        assert one.content_hash == new.chart("order").identity.content_hash
        again = await new.migrate("o1")
        assert (again.migrated, again.reason) == (False, "already on the chart given")

        summary = await new.migrate_all(
            "order", state_map={"paid": "charged"}, data={"carrier": "post"}
        )
        assert summary == MigrationSummary(("o0",), {"o2": HELD}, {}, {})
        parked = await new.describe("o2")
        assert (parked.status, parked.failure) == (Status.NEEDS_MIGRATION, HELD)
        assert parked.configuration == ("held",)  # still on its old chart
        assert parked.inputs[-1].migration is not None
        assert parked.as_json()["inputs"][-1]["migration"]["parked"] == HELD
        assert (await new.send("o2", "ship")).delivered is False

        shipped = await new.send("o1", "ship")
        assert (shipped.delivered, shipped.status) == (True, Status.COMPLETED)
        moved = await new.describe("o0")
        assert [entry.via for entry in moved.inputs] == ["migrate"]
        assert (await new.send("o0", "pay")).configuration == ("charged",)

        # o2 is still on the old revision: a map that does not fit it is refused.
        with pytest.raises(InvalidMigrationPlan):
            await new.migrate_all("order", state_map={"paid": "nowhere"})
        with pytest.raises(UnknownChart):
            await new.migrate_all("invoice")

        # Mapping held onto charged moves the parked one too.
        fixed = await new.migrate("o2", state_map={"paid": "charged", "held": "charged"})
        assert fixed.migrated is False  # carrier is declared and missing
        assert fixed.reason == "the new chart declares data the position lacks: ['carrier']"
        fixed = await new.migrate(
            "o2", state_map={"paid": "charged", "held": "charged"}, data={"carrier": None}
        )
        assert (fixed.migrated, fixed.configuration) == (True, ("charged",))
