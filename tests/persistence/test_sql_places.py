"""A store's place among a deployment's stores (statifier.sql.places) on both
databases: a store without a record takes the place it is given, the same place is
accepted again, and another place, a store a reshard is moving and one it retired are
refused, each saying what to do; ``migrations.prepare`` claims the place it is given,
migrating or not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - fixture

from statifier.sql import TableOptions, migrations
from statifier.sql.places import Place, PlaceMismatch, claim_place, read_place, write_place

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def _options(fresh: FreshDatabase) -> TableOptions:
    return TableOptions(prefix="pl_", schema=fresh.schema)


def _on(fresh: FreshDatabase, work: Any) -> Any:
    engine = sa.create_engine(migrations.sync_url(fresh.url))
    try:
        with engine.begin() as connection:
            return work(connection)
    finally:
        engine.dispose()


@pytest.mark.parametrize("key_type", [sa.BigInteger, sa.Uuid], ids=["integer", "uuid"])
def test_a_store_takes_its_place_once_and_refuses_another(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    key_type: Any,
) -> None:
    options = TableOptions(prefix="pl_", schema=fresh_database.schema, key_type=key_type)
    migrations.upgrade(fresh_database.url, options)
    assert _on(fresh_database, lambda c: read_place(c, options)) is None
    _on(fresh_database, lambda c: claim_place(c, options, Place.serving(1, 3), NOW))
    _on(fresh_database, lambda c: claim_place(c, options, Place.serving(1, 3), NOW))
    assert _on(fresh_database, lambda c: read_place(c, options)) == Place(1, 3, "serving")
    for other in (Place.serving(0, 3), Place.serving(1, 4)):
        with pytest.raises(PlaceMismatch) as refused:
            _on(fresh_database, lambda c, p=other: claim_place(c, options, p, NOW))
        said = str(refused.value)
        assert f"store {other.place} of {other.stores} holds place 1 of 3" in said
        assert "changed without statifier reshard" in said


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        (Place(1, 3, "moving"), "statifier reshard is moving its buckets"),
        (Place(None, None, "retired"), "moved every bucket of it to the other stores"),
    ],
)
def test_a_store_a_reshard_moves_or_retired_is_refused(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    recorded: Place,
    said: str,
) -> None:
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options)
    _on(fresh_database, lambda c: write_place(c, options, recorded, NOW))
    with pytest.raises(PlaceMismatch, match=said):
        _on(fresh_database, lambda c: claim_place(c, options, Place.serving(1, 3), NOW))
    assert _on(fresh_database, lambda c: read_place(c, options)) == recorded


@pytest.mark.parametrize("migrate", [True, False])
def test_prepare_claims_the_place_it_is_given(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    migrate: bool,
) -> None:
    options = _options(fresh_database)
    if not migrate:
        migrations.upgrade(fresh_database.url, options)
    migrations.prepare(fresh_database.url, options, migrate=migrate, place=Place.serving(0, 2))
    assert _on(fresh_database, lambda c: read_place(c, options)) == Place(0, 2, "serving")
    with pytest.raises(PlaceMismatch, match="store 1 of 2 holds place 0 of 2"):
        migrations.prepare(fresh_database.url, options, migrate=migrate, place=Place.serving(1, 2))
    migrations.prepare(fresh_database.url, options, migrate=migrate)  # no place: unchecked


def test_a_place_is_one_of_the_stores() -> None:
    with pytest.raises(ValueError, match="place 3 is not one of 3 stores"):
        Place.serving(3, 3)
