"""Every test of ``test_subscriptions`` again, on PostgreSQL tables laid out as a host may have
written them by hand (``hand_layout``: a leading column, timestamps leading, collated
text columns, a text key the database fills in and the router reads back)."""

from __future__ import annotations

import pytest
from tests.persistence.conftest import SqlStore, hand_store  # noqa: F401 - a fixture
from tests.router.test_subscriptions import *  # noqa: F403 - the same tests, collected here again


@pytest.fixture
def router_store(hand_store: SqlStore) -> SqlStore:  # noqa: F811 - the fixture above
    """The hand layout's database in place of each backend's default one."""
    return hand_store
