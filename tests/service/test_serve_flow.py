"""Flow control in a serve file: a batch binding's events (here, a schedule's fires)
held and delivered by the service's flow worker, in order, each once, on both
databases; ``[flow] enabled = false`` delivers none and says so, naming the bindings
and the caps that hold; ``[caps.DOCUMENT]`` refusing creates beyond it; the refusals
of ``[flow]``, ``[caps]`` and of a binding's mode fields, each naming the field."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - a fixture
from tests.service.helpers import HITS, HITS_BINDING, database_table, running, write_config
from tests.service.test_serve import router_on

from statifier.persistence import Executions
from statifier.router import Cap, FlowWorker, OverLimit, Router, address, ledger
from statifier.service import load
from statifier.service.settings import ServiceConfigError

BATCHED = """
[[bindings]]
id = "beats"
source = "clock"
match = "true"
key = "event.schedule"
document = "hits"
event = "hit"
data = ["fire_time"]
mode = "batch"
batch = 3
window = "PT1M"

[schedules.beat]
every = "PT1S"
source = "clock"
scope = "ops"
"""
"""A fire a second, delivered three at a time."""


def _config(directory: Path, database: FreshDatabase, more: str = "") -> Path:
    body = f"""
migrate = true
shutdown_timeout = 5
charts = "charts"
{BATCHED}
{database_table(database)}
[http]
port = 0
{more}
"""
    return write_config(directory, body, {"hits": HITS})


async def _batches(router: Router) -> list[list[str]]:
    """The fire times of each batch the counter received, in its input order."""
    found = await address(router, "ops", "hits", "beat")
    if found is None:
        return []
    batches = []
    for entry in await Executions(router.storage).inputs(found.execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        batches.append([str(held["fire_time"]) for held in data["events"]])
    return batches


@pytest.mark.asyncio
async def test_a_service_delivers_what_a_batch_binding_holds(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, fresh_database)
    async with running(config), router_on(config, fresh_database) as router:
        deadline = time.monotonic() + 20
        while len(await _batches(router)) < 2:
            assert time.monotonic() < deadline, "no batch was delivered"
            await asyncio.sleep(0.1)
    async with router_on(config, fresh_database) as router:
        batches = await _batches(router)
        assert all(len(batch) == 3 for batch in batches), batches
        times = [fire for batch in batches for fire in batch]
        assert times == sorted(set(times))  # in order, none twice
        # What the last fires left held waits for the next service (or the window).
        held = sum(group.held for group in await FlowWorker(router).groups())
        assert held < 3


@pytest.mark.asyncio
async def test_a_service_with_the_flow_worker_off_delivers_nothing_and_says_so(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A one-second window and room for a hundred: due while the service runs, but no
    # worker takes it.
    body = "\n[flow]\nenabled = false\n"
    config = _config(tmp_path, fresh_database, body)
    text = config.read_text(encoding="utf-8").replace('window = "PT1M"', 'window = "PT1S"')
    text = text.replace("batch = 3", "batch = 100")
    config.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="statifier.service"):
        async with running(config):
            await asyncio.sleep(3.5)
    warned = [r.getMessage() for r in caplog.records if r.name == "statifier.service"]
    assert any("[flow] enabled = false" in line and "'beats'" in line for line in warned)
    async with router_on(config, fresh_database) as router:
        assert await _batches(router) == []
        worker = FlowWorker(router)
        assert (await worker.totals())[1] >= 1
        assert await worker.next_due() is not None


@pytest.mark.asyncio
async def test_a_service_with_the_flow_worker_off_names_the_caps_that_hold_creates(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No binding holds events: only the cap that holds creates waits for a flow worker.
    body = f"""
migrate = true
charts = "charts"
{HITS_BINDING}
[database]
url = "sqlite:///{tmp_path / "x.db"}"

[http]
port = 0

[flow]
enabled = false

[caps.hits]
max_active = 2

[caps.tallies]
max_active = 2
over = "drop"
"""
    config = write_config(tmp_path, body, {"hits": HITS, "tallies": HITS})
    assert load(config).caps["hits"].over is OverLimit.HOLD
    with caplog.at_level(logging.WARNING, logger="statifier.service"):
        async with running(config):
            pass
    warned = [r.getMessage() for r in caplog.records if r.name == "statifier.service"]
    said = [line for line in warned if line.startswith("[flow] enabled = false")]
    assert len(said) == 1, warned
    assert "'hits'" in said[0], said
    assert 'over = "hold"' in said[0], said
    assert "'tallies'" not in said[0]  # a cap that drops holds nothing


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ("[flow]\nretry = 10\nmax_retry = 5\n", r"\[flow\] max_retry: must be at least"),
        ("[flow]\npoll = 0\n", r"\[flow\] poll: "),
        ("[flow]\nenabeld = true\n", r"\[flow\] enabeld: unknown key"),
    ],
    ids=["max_retry", "poll", "unknown"],
)
def test_a_flow_table_the_file_gets_wrong_is_refused_naming_it(
    tmp_path: Path, more: str, message: str
) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'x.db'}", None)
    with pytest.raises(ServiceConfigError, match=message):
        load(_config(tmp_path, database, more))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('window = "PT1M"', 'window = "P1M"', r"window: 'P1M' is not a duration"),
        ("batch = 3", "batch = 0", r"batch: must be an integer from 1 to 1000"),
        ('mode = "batch"', 'mode = "bunch"', r"mode: must be one of each, debounce"),
    ],
    ids=["window", "batch", "mode"],
)
def test_a_mode_field_the_file_gets_wrong_is_refused_naming_it(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'x.db'}", None)
    config = _config(tmp_path, database)
    config.write_text(config.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    with pytest.raises(ServiceConfigError, match=r"\[bindings #1 \"beats\"\] " + message):
        load(config)


CAPPED = """
[[bindings]]
id = "ticks"
source = "ticker"
match = "true"
key = "event.fire_time"
document = "hits"
event = "hit"

[schedules.tick]
every = "PT1S"
source = "ticker"
scope = "ops"

[caps.hits]
max_active = 2
over = "drop"
"""
"""A new execution a second, at most two of them."""


@pytest.mark.asyncio
async def test_a_service_caps_the_executions_a_document_has_active(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, fresh_database, CAPPED)
    assert load(config).caps == {"hits": Cap(2, over=OverLimit.DROP)}
    async with running(config), router_on(config, fresh_database) as router:
        deadline = time.monotonic() + 20
        while sum(row.spelled == "dropped: over_limit" for row in await ledger(router)) < 2:
            assert time.monotonic() < deadline, "no create was refused"
            await asyncio.sleep(0.1)
    async with router_on(config, fresh_database) as router:
        outcomes = [row.spelled for row in await ledger(router) if row.binding_id == "ticks"]
        # Two creates, the first fire's among them, and drops: on a loaded machine the
        # ledger once listed a drop second (the cause is not established; the whole
        # list is in the message should it come again).
        created = [n for n, outcome in enumerate(outcomes) if outcome == "created_and_delivered"]
        assert len(created) == 2, outcomes
        assert created[0] == 0, outcomes
        assert set(outcomes) == {"created_and_delivered", "dropped: over_limit"}, outcomes


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ("[caps.nowhere]\nmax_active = 1\n", r"\[caps.nowhere\] no document 'nowhere'"),
        ("[caps.hits]\nover = 'drop'\n", r"\[caps.hits\] max_active: required"),
        ("[caps.hits]\nmax_active = 0\n", r"\[caps.hits\] max_active: must be an integer"),
        ("[caps.hits]\nmax_active = 1\nper = 'tenant'\n", r"\[caps.hits\] per: must be one of"),
        ("[caps.hits]\nmax_active = 1\nmax = 2\n", r"\[caps.hits\] max: unknown key"),
    ],
    ids=["document", "required", "range", "per", "unknown"],
)
def test_a_cap_the_file_gets_wrong_is_refused_naming_it(
    tmp_path: Path, more: str, message: str
) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'x.db'}", None)
    with pytest.raises(ServiceConfigError, match=message):
        load(_config(tmp_path, database, more))
