"""Every test of the console's app again, on PostgreSQL tables laid out as a host may
have written them by hand (``hand_layout``: a leading column, timestamps leading,
collated text columns, a text key the database fills in, which the console's links
and cursors carry)."""

from __future__ import annotations

import pytest
from tests.console.test_app import *  # noqa: F403 - the same tests, collected here again
from tests.persistence.conftest import SqlStore, hand_store  # noqa: F401 - a fixture


@pytest.fixture
def router_store(hand_store: SqlStore) -> SqlStore:  # noqa: F811 - the fixture above
    """The hand layout's database in place of each backend's default one."""
    return hand_store


@pytest.fixture
def console_store(hand_store: SqlStore) -> SqlStore:  # noqa: F811 - the fixture above
    """The same, for the tests that read through the console's queries."""
    return hand_store
