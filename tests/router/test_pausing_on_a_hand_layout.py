"""The pause tests of ``test_pausing`` that run in this process, again on PostgreSQL
tables laid out as a host may have written them by hand (``hand_layout``: a leading
column, timestamps leading, collated text columns, a text key the database fills in):
held events keep the order they came in whatever the key."""

from __future__ import annotations

import pytest
from tests.persistence.conftest import SqlStore, hand_store  # noqa: F401 - a fixture
from tests.router.test_pausing import (  # noqa: F401 - the same tests, collected here again
    test_events_sent_to_a_paused_execution_are_held_and_stepped_on_resume,
    test_timers_due_while_paused_wait_with_the_events_and_an_end_discards_the_rest,
)


@pytest.fixture
def router_store(hand_store: SqlStore) -> SqlStore:  # noqa: F811 - the fixture above
    """The hand layout's database in place of each backend's default one."""
    return hand_store
