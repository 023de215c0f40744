"""The blob codec on both databases: encrypted blobs are unreadable in the tables, a
whole execution round-trips through them, keys rotate, and the identity codec stores
what it did before."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.durable import Durable
from statifier.persistence import (
    PLAIN,
    Executions,
    MemoryAdapter,
    Status,
    Stepped,
    Storage,
    UndecodableBlob,
    decode_outcome,
)
from statifier.persistence.codec import BlobCodec
from statifier.persistence.fernet import FernetCodec, FernetKeyError
from statifier.persistence.sql import SqlAdapter
from statifier.sql import migrations
from statifier.sql.blobs import BLOB_COLUMNS, rewrite_blobs

from .conftest import SqlStore

CHART_MARKER = "CHART-MARKER-7f3a"
DATA_MARKER = "DATAMODEL-MARKER-51c2"
CARD = "4111111111111111"

# The chart's source (a comment), its datamodel, the event's data and the donedata each
# carry a marker of their own, so each blob column can be checked for the clear text.
PAYMENT = f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open"
    datamodel="predicator">
  <!-- {CHART_MARKER} -->
  <datamodel>
    <data id="note" expr="'{DATA_MARKER}'"/>
    <data id="card" expr="''"/>
  </datamodel>
  <state id="open">
    <transition event="pay" target="paid"><assign location="card" expr="_event.data.card"/>
    </transition>
  </state>
  <state id="paid"><transition event="settle" target="settled"/></state>
  <final id="settled">
    <donedata><param name="card" expr="card"/><param name="note" expr="note"/></donedata>
  </final>
</scxml>"""

MARKERS = (CHART_MARKER.encode(), DATA_MARKER.encode(), CARD.encode())


@pytest.fixture
def machine() -> Machine:
    return compile_chart(PAYMENT)


@pytest.fixture
def key_a() -> str:
    return FernetCodec.generate_key()


@pytest.fixture
def key_b() -> str:
    return FernetCodec.generate_key()


def _blobs(store: SqlStore) -> Iterator[tuple[str, bytes]]:
    """Every blob in the tables, read with plain SQL: ``(column, bytes)``."""
    tables = store.tables
    columns = (
        (tables.charts, "chart_blob"),
        (tables.executions, "position_blob"),
        (tables.executions, "outcome_blob"),
        (tables.inputs, "input_blob"),
        (tables.positions, "position_blob"),
    )
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.connect() as connection:
            for table, column in columns:
                for (value,) in connection.execute(sa.select(table.c[column])):
                    if value is not None:
                        yield f"{table.name}.{column}", bytes(value)
    finally:
        engine.dispose()


def _stored(store: SqlStore) -> dict[str, list[bytes]]:
    found: dict[str, list[bytes]] = {}
    for column, value in _blobs(store):
        found.setdefault(column, []).append(value)
    return found


async def _run_payment(storage: Storage, machine: Machine, execution_id: str) -> None:
    """Create, pay and save a position: every blob column gets a row."""
    executions = Executions(storage)
    await executions.create(execution_id, machine)
    stepped = await executions.step(execution_id, machine, Event("pay", data={"card": CARD}))
    assert isinstance(stepped, Stepped)
    await storage.save_position(f"saved-{execution_id}", stepped.state)


@pytest.mark.asyncio
async def test_encrypted_blobs_hold_no_clear_text_and_resume_in_a_new_process_view(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str
) -> None:
    codec = FernetCodec([key_a])
    await _run_payment(Storage(sql_adapter, codec=codec), machine, "txn-1")
    await Executions(Storage(sql_adapter, codec=codec)).step("txn-1", machine, Event("settle"))

    stored = _stored(sql_store)
    assert set(stored) == {
        f"{sql_store.tables.charts.name}.chart_blob",
        f"{sql_store.tables.executions.name}.position_blob",
        f"{sql_store.tables.executions.name}.outcome_blob",
        f"{sql_store.tables.inputs.name}.input_blob",
        f"{sql_store.tables.positions.name}.position_blob",
    }
    for column, values in stored.items():
        for value in values:
            assert value.startswith(b"gAAAAA"), column  # a Fernet token, version 0x80
            for marker in MARKERS:
                assert marker not in value, (column, marker)
            # Quoted, as clear JSON would hold them: a Fernet token is URL-safe base64,
            # which never holds a quote but may hold the bare letters by chance.
            assert b'"pay"' not in value, column
            assert b'"settled"' not in value, column

    # A fresh adapter and storage (what another process would open) reads it all back.
    async with SqlAdapter(sql_store.url, sql_store.tables) as other:
        storage = Storage(other, codec=FernetCodec([key_a]))
        executions = Executions(storage)
        record = await storage.fetch_execution("txn-1")
        assert record.status is Status.COMPLETED
        assert decode_outcome(record) == {"card": CARD, "note": DATA_MARKER}
        logged = await executions.inputs("txn-1")
        assert [entry.event.name for entry in logged if entry.event] == ["pay", "settle"]
        assert logged[0].event is not None
        assert logged[0].event.data == {"card": CARD}
        chart = await storage.fetch_chart(machine.identity.content_hash)
        assert chart.source is not None
        assert CHART_MARKER.encode() in chart.source
        # The chart compiles again from the decoded source (the identity guard holds).
        storage_without_cache = Storage(other, codec=FernetCodec([key_a]))
        again = await storage_without_cache.machine(machine.identity.content_hash)
        assert again.identity == machine.identity
        saved = await storage.load_position("saved-txn-1", machine)
        assert saved is not None
        assert saved.datamodel["card"] == CARD


@pytest.mark.asyncio
async def test_a_step_resumes_from_an_encrypted_position_with_a_cold_cache(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str
) -> None:
    await _run_payment(Storage(sql_adapter, codec=FernetCodec([key_a])), machine, "txn-2")
    async with SqlAdapter(sql_store.url, sql_store.tables) as other:
        storage = Storage(other, codec=FernetCodec([key_a]))
        # No machine given: the stored (encrypted) chart is decoded and compiled.
        done = await Executions(storage).step("txn-2", None, Event("settle"))
        assert isinstance(done, Stepped)
        assert done.execution.status is Status.COMPLETED
        assert done.donedata == {"card": CARD, "note": DATA_MARKER}


@pytest.mark.asyncio
async def test_keys_rotate_old_rows_read_new_writes_use_the_new_key_then_the_old_one_goes(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str, key_b: str
) -> None:
    await _run_payment(Storage(sql_adapter, codec=FernetCodec([key_a])), machine, "old")
    written_under_a = _stored(sql_store)

    rotated = Storage(sql_adapter, codec=FernetCodec([key_b, key_a]))
    old = await rotated.fetch_execution("old")  # written under A, read under [B, A]
    assert old.position is not None
    assert old.status is Status.ACTIVE
    assert (await rotated.load_position("saved-old", machine)) is not None
    assert len(await Executions(rotated).inputs("old")) == 1

    await _run_payment(rotated, machine, "new")
    only_a, only_b = FernetCodec([key_a]), FernetCodec([key_b])
    engine = sa.create_engine(migrations.sync_url(sql_store.url))
    executions_table = sql_store.tables.executions
    try:
        with engine.connect() as connection:
            rows = dict(
                connection.execute(
                    sa.select(executions_table.c.execution_id, executions_table.c.position_blob)
                ).all()
            )
            input_rows = connection.execute(
                sa.select(
                    sql_store.tables.inputs.c.execution_id, sql_store.tables.inputs.c.input_blob
                )
            ).all()
    finally:
        engine.dispose()
    assert only_b.decode(bytes(rows["new"]))  # new writes are under B...
    with pytest.raises(UndecodableBlob):
        only_a.decode(bytes(rows["new"]))  # ...and not under A
    assert only_a.decode(bytes(rows["old"]))  # untouched rows stay under A
    for execution_id, blob in input_rows:
        (only_b if execution_id == "new" else only_a).decode(bytes(blob))

    # A step of the old execution rewrites its position under B.
    await Executions(rotated).step("old", machine, Event("settle"))
    with engine.connect() as connection:
        position = connection.execute(
            sa.select(executions_table.c.position_blob).where(
                executions_table.c.execution_id == "old"
            )
        ).scalar_one()
    engine.dispose()
    assert only_b.decode(bytes(position))
    assert written_under_a  # the rows A wrote were there to rotate from

    # A dropped: what only A encrypted (the old input, the old saved position) fails,
    # typed, naming what it belongs to and never a key.
    dropped = Storage(sql_adapter, codec=FernetCodec([key_b]))
    assert (await dropped.fetch_execution("new")).position is not None
    with pytest.raises(UndecodableBlob, match="input 0 of execution 'old'") as failure:
        await Executions(dropped).inputs("old")
    for key in (key_a, key_b):
        assert key not in str(failure.value)
    with pytest.raises(UndecodableBlob, match="the position saved as 'saved-old'"):
        await dropped.load_position("saved-old", machine)
    # The chart was saved (first wins) under A: the new key alone cannot compile it.
    with pytest.raises(
        UndecodableBlob, match=f"the source of chart {machine.identity.content_hash}"
    ):
        await dropped.fetch_chart(machine.identity.content_hash)


@pytest.mark.asyncio
async def test_a_blob_altered_in_the_database_fails_typed(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str
) -> None:
    storage = Storage(sql_adapter, codec=FernetCodec([key_a]))
    await _run_payment(storage, machine, "txn-3")
    table = sql_store.tables.executions
    engine = sa.create_engine(migrations.sync_url(sql_store.url))
    try:
        with engine.begin() as connection:
            blob = bytes(
                connection.execute(
                    sa.select(table.c.position_blob).where(table.c.execution_id == "txn-3")
                ).scalar_one()
            )
            flipped = blob[:-5] + (b"A" if blob[-5:-4] != b"A" else b"B") + blob[-4:]
            connection.execute(
                table.update().where(table.c.execution_id == "txn-3").values(position_blob=flipped)
            )
    finally:
        engine.dispose()
    with pytest.raises(UndecodableBlob, match="the position of execution 'txn-3'"):
        await Executions(Storage(sql_adapter, codec=FernetCodec([key_a]))).step(
            "txn-3", machine, Event("settle")
        )


@pytest.mark.asyncio
async def test_the_identity_codec_stores_blobs_as_given(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine
) -> None:
    storage = Storage(sql_adapter)
    assert storage.codec is PLAIN
    await _run_payment(storage, machine, "plain")
    stored = _stored(sql_store)
    charts = stored[f"{sql_store.tables.charts.name}.chart_blob"]
    assert charts == [machine.source]
    record = await storage.fetch_execution("plain")
    assert stored[f"{sql_store.tables.executions.name}.position_blob"] == [record.position]
    inputs = await storage.inputs("plain")
    assert stored[f"{sql_store.tables.inputs.name}.input_blob"] == [inputs[0].event]
    assert CARD.encode() in b"".join(stored[f"{sql_store.tables.executions.name}.position_blob"])


@pytest.mark.asyncio
async def test_a_codec_on_the_memory_adapter_and_through_a_view(machine: Machine) -> None:
    class Counting:
        def __init__(self) -> None:
            self.encoded = 0
            self.decoded = 0

        def encode(self, blob: bytes) -> bytes:
            self.encoded += 1
            return b"~" + blob[::-1]

        def decode(self, stored: bytes) -> bytes:
            self.decoded += 1
            if not stored.startswith(b"~"):
                raise UndecodableBlob("not reversed")
            return stored[1:][::-1]

    counting = Counting()
    codec: BlobCodec = counting
    adapter = MemoryAdapter()
    storage = Storage(adapter, codec=codec)
    await _run_payment(storage.over(adapter), machine, "m-1")
    raw = await adapter.fetch_execution("m-1")
    assert raw is not None
    assert raw.position is not None
    assert raw.position.startswith(b"~")
    assert (await storage.fetch_execution("m-1")).position == raw.position[1:][::-1]
    assert counting.encoded >= 5
    assert counting.decoded >= 1


class CountingFernet:
    """Fernet, counting its decodes."""

    def __init__(self, key: str) -> None:
        self.fernet = FernetCodec([key])
        self.decoded = 0

    def encode(self, blob: bytes) -> bytes:
        return self.fernet.encode(blob)

    def decode(self, stored: bytes) -> bytes:
        self.decoded += 1
        return self.fernet.decode(stored)


@pytest.mark.asyncio
async def test_a_step_decodes_no_position_it_wrote_itself(
    sql_adapter: SqlAdapter, machine: Machine, key_a: str
) -> None:
    """The storage keeps the encoded bytes of the last position it wrote: the next step
    of the same execution reads them back without decoding; bytes written elsewhere
    (another storage, another process) are decoded."""
    counting = CountingFernet(key_a)
    storage = Storage(sql_adapter, codec=counting)
    executions = Executions(storage)
    await executions.create("txn-4", machine)
    before = counting.decoded
    await executions.step("txn-4", machine, Event("pay", data={"card": CARD}))
    assert counting.decoded == before  # its own position, not decoded again
    elsewhere = CountingFernet(key_a)
    done = await Executions(Storage(sql_adapter, codec=elsewhere)).step(
        "txn-4", machine, Event("settle")
    )
    assert isinstance(done, Stepped)
    assert done.donedata == {"card": CARD, "note": DATA_MARKER}
    assert elsewhere.decoded == 1  # a position another storage wrote
    # The first storage's memory is stale now: it decodes what the other one wrote.
    record = await storage.fetch_execution("txn-4")
    assert counting.decoded == before + 2  # the position and the outcome
    assert record.status is Status.COMPLETED
    assert decode_outcome(record) == {"card": CARD, "note": DATA_MARKER}


@pytest.mark.asyncio
async def test_durable_takes_a_codec(sql_store: SqlStore, key_a: str) -> None:
    sql_store.empty()
    charts = {"payment": PAYMENT}
    codec = FernetCodec([key_a])
    async with Durable(
        sql_store.url, charts=charts, tables=sql_store.tables.options, codec=codec
    ) as durable:
        await durable.create("payment", "d-1")
        await durable.send("d-1", "pay", {"card": CARD})
        described = await durable.describe("d-1")
        assert described.configuration == ("paid",)
    for column, value in _blobs(sql_store):
        assert CARD.encode() not in value, column
        assert DATA_MARKER.encode() not in value, column


def test_fernet_keys_are_checked_and_never_echoed() -> None:
    with pytest.raises(FernetKeyError, match="one or more"):
        FernetCodec([])
    with pytest.raises(FernetKeyError, match="one or more"):
        FernetCodec(FernetCodec.generate_key())  # a str: one key, not a list
    secret = "not-a-key-but-secret-s3cr3t"
    with pytest.raises(FernetKeyError, match="key 2 of 2 is not a Fernet key") as bad:
        FernetCodec([FernetCodec.generate_key(), secret])
    assert secret not in str(bad.value)
    key = FernetCodec.generate_key()
    assert key not in repr(FernetCodec([key]))
    assert repr(FernetCodec([key])) == "FernetCodec(<1 key>)"


def test_fernet_keys_come_from_the_environment() -> None:
    new, old = FernetCodec.generate_key(), FernetCodec.generate_key()
    environ = {"APP_KEY_NEW": new, "APP_KEY_OLD": f" {old}\n", "APP_KEY_BAD": "s3cr3t"}
    codec = FernetCodec.from_env(["APP_KEY_NEW", "APP_KEY_OLD"], environ)
    assert FernetCodec([new]).decode(codec.encode(b"x")) == b"x"
    assert codec.decode(FernetCodec([old]).encode(b"y")) == b"y"
    with pytest.raises(FernetKeyError, match="APP_KEY_MISSING holds no Fernet key"):
        FernetCodec.from_env(["APP_KEY_NEW", "APP_KEY_MISSING"], environ)
    with pytest.raises(FernetKeyError, match="the key in APP_KEY_BAD is not") as bad:
        FernetCodec.from_env(["APP_KEY_BAD"], environ)
    assert "s3cr3t" not in str(bad.value)
    with pytest.raises(FernetKeyError, match="name one or more"):
        FernetCodec.from_env("APP_KEY_NEW", environ)


def test_fernet_round_trips_any_bytes_and_rotates() -> None:
    a, b = FernetCodec.generate_key(), FernetCodec.generate_key()
    codec = FernetCodec([a])
    for blob in (b"", b"\x00\xff" * 1000, "é".encode()):
        token = codec.encode(blob)
        assert codec.decode(token) == blob
        assert codec.encode(blob) != token  # a fresh IV each time
    token = codec.encode(b"rotate me")
    rotated = FernetCodec([b, a]).rotate(token)
    assert FernetCodec([b]).decode(rotated) == b"rotate me"
    with pytest.raises(UndecodableBlob):
        FernetCodec([b]).decode(b"plain bytes, never encrypted")
    with pytest.raises(UndecodableBlob):
        FernetCodec([b]).rotate(token)


@pytest.mark.asyncio
async def test_rewriting_the_blobs_retires_the_old_key(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str, key_b: str
) -> None:
    await _run_payment(Storage(sql_adapter, codec=FernetCodec([key_a])), machine, "old")
    await Executions(Storage(sql_adapter, codec=FernetCodec([key_a]))).step(
        "old", machine, Event("settle")
    )
    counts = rewrite_blobs(sql_store.url, FernetCodec([key_b, key_a]).rotate, sql_store.tables)
    assert counts == {
        "charts.chart_blob": 1,
        "positions.position_blob": 1,
        "executions.position_blob": 1,
        "executions.outcome_blob": 1,
        "inputs.input_blob": 2,
        "consumer_dead_letters.raw": 0,
        "timers.payload": 0,
        "outbox.payload.event": 0,
        "inbound_events.data": 0,
    }
    only_a, only_b = FernetCodec([key_a]), FernetCodec([key_b])
    for column, value in _blobs(sql_store):
        assert only_b.decode(value), column
        with pytest.raises(UndecodableBlob):
            only_a.decode(value)
    # Everything reads under the new key alone, the chart included.
    async with SqlAdapter(sql_store.url, sql_store.tables) as other:
        storage = Storage(other, codec=only_b)
        assert (await storage.machine(machine.identity.content_hash)).identity == machine.identity
        assert decode_outcome(await storage.fetch_execution("old")) == {
            "card": CARD,
            "note": DATA_MARKER,
        }
        assert len(await Executions(storage).inputs("old")) == 2
        assert (await storage.load_position("saved-old", machine)) is not None
    # Run again: what is under B already is rewritten under B (nothing lost).
    again = rewrite_blobs(sql_store.url, FernetCodec([key_b]).rotate, sql_store.tables, batch=1)
    assert sum(again.values()) == 6


@pytest.mark.asyncio
async def test_rewriting_keeps_a_blob_written_while_it_ran(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str, key_b: str
) -> None:
    """A row stored again between the sweep's read and its write keeps the newer bytes."""
    for index in range(3):
        await _run_payment(
            Storage(sql_adapter, codec=FernetCodec([key_a])), machine, f"txn-{index}"
        )
    table = sql_store.tables.executions
    newer = FernetCodec([key_b]).encode(b"a newer position, written by a step")
    rotate = FernetCodec([key_b, key_a]).rotate
    engine = sa.create_engine(migrations.sync_url(sql_store.url))
    raced: list[bytes] = []
    with engine.connect() as connection:
        stored_positions = {
            bytes(value) for (value,) in connection.execute(sa.select(table.c.position_blob))
        }

    def racing(blob: bytes) -> bytes:
        rewritten = rotate(blob)
        if not raced and blob in stored_positions:
            raced.append(blob)
            with engine.begin() as connection:  # what a step would do meanwhile
                connection.execute(
                    table.update().where(table.c.position_blob == blob).values(position_blob=newer)
                )
        return rewritten

    try:
        counts = rewrite_blobs(sql_store.url, racing, sql_store.tables, batch=2)
        with engine.connect() as connection:
            positions = [
                bytes(value) for (value,) in connection.execute(sa.select(table.c.position_blob))
            ]
    finally:
        engine.dispose()
    assert counts["executions.position_blob"] == 2  # three rows, one kept as written
    assert newer in positions
    assert raced


def test_rewriting_refuses_a_batch_of_nothing(sql_store: SqlStore) -> None:
    with pytest.raises(ValueError, match="at least 1 row"):
        rewrite_blobs(sql_store.url, bytes, sql_store.tables, batch=0)


REWRITER = Path(__file__).with_name("blob_rewriter.py")


def _plain_blobs(store: SqlStore, codec: FernetCodec) -> dict[tuple[str, str, int], bytes]:
    """Every stored blob decoded, by ``(table, column, id)``."""
    tables = store.tables
    found: dict[tuple[str, str, int], bytes] = {}
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.connect() as connection:
            for table_name, column in BLOB_COLUMNS:
                table = getattr(tables, table_name)
                query = sa.select(table.c.id, table.c[column]).where(table.c[column].is_not(None))
                for row_id, value in connection.execute(query):
                    found[(table_name, column, row_id)] = codec.decode(bytes(value))
    finally:
        engine.dispose()
    return found


def _under(store: SqlStore, codec: FernetCodec) -> Iterator[str]:
    """The columns of the blobs ``codec`` decodes, one per blob."""
    for column, value in _blobs(store):
        try:
            codec.decode(value)
        except UndecodableBlob:
            continue
        yield column


def _rewriter(store: SqlStore, environ: dict[str, str]) -> subprocess.Popen[str]:
    schema = store.tables.options.schema or "-"
    return subprocess.Popen(
        [sys.executable, str(REWRITER), store.url, store.tables.options.prefix, schema],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **environ},
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_rewrite_killed_anywhere_and_run_again_loses_no_blob(
    backend: str, request: pytest.FixtureRequest, key_a: str, key_b: str, machine: Machine
) -> None:
    """SIGKILL the sweep at random moments, many times, then let it finish: every blob is
    under the new key alone and decodes to exactly what it held before."""
    store: SqlStore = request.getfixturevalue(f"{backend}_store")
    store.empty()

    async def fill() -> None:
        async with SqlAdapter(store.url, store.tables) as adapter:
            storage = Storage(adapter, codec=FernetCodec([key_a]))
            for index in range(8):
                await _run_payment(storage, machine, f"txn-{index}")
                if index % 2:
                    await Executions(storage).step(f"txn-{index}", machine, Event("settle"))

    asyncio.run(fill())
    before = _plain_blobs(store, FernetCodec([key_a]))
    assert len(before) == 1 + 8 + 8 + 4 + 12  # chart, saved, positions, outcomes, inputs
    environ = {"NEW_KEY": key_b, "OLD_KEY": key_a}
    chance = random.Random(78)
    killed, halfway = 0, 0
    for _ in range(10):
        child = _rewriter(store, environ)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(chance.uniform(0.0, 0.06))  # the sweep takes 33 x 2 ms at least
        child.kill()  # SIGKILL
        child.wait(timeout=30)
        killed += child.returncode == -signal.SIGKILL
        child.communicate()
        # Every blob still decodes (under one key or the other) to what it held.
        assert _plain_blobs(store, FernetCodec([key_b, key_a])) == before
        under_b = sum(1 for _ in _under(store, FernetCodec([key_b])))
        halfway += 0 < under_b < len(before)
    assert killed >= 5  # most kills landed mid-sweep...
    assert halfway >= 1  # ...and some with part of it written
    finished = _rewriter(store, environ)
    out, err = finished.communicate(timeout=120)
    assert finished.returncode == 0, err
    assert out.splitlines()[-1] == f"done {len(before)}"
    assert _plain_blobs(store, FernetCodec([key_b])) == before


@pytest.mark.asyncio
async def test_a_migrated_position_and_a_childs_answer_are_stored_encoded(
    sql_adapter: SqlAdapter, sql_store: SqlStore, machine: Machine, key_a: str
) -> None:
    from statifier.persistence import Migrated, MigrationPlan
    from statifier.persistence.records import AnswerRecord

    codec = FernetCodec([key_a])
    storage = Storage(sql_adapter, codec=codec)
    executions = Executions(storage)
    await _run_payment(storage, machine, "moving")
    revised = compile_chart(PAYMENT.replace('"paid"', '"charged"'))
    moved = await executions.migrate("moving", MigrationPlan(machine, revised, {"paid": "charged"}))
    assert isinstance(moved, Migrated)
    for column, values in _stored(sql_store).items():
        for value in values:
            assert value.startswith(b"gAAAAA"), column
            assert CARD.encode() not in value, column
    done = await executions.step("moving", revised, Event("settle"))
    assert isinstance(done, Stepped)
    assert done.donedata == {"card": CARD, "note": DATA_MARKER}

    answer = AnswerRecord(
        "child-1",
        parent_id="parent-1",
        invoke_id="kid",
        content_hash=machine.identity.content_hash,
        status=Status.COMPLETED,
        outcome=CARD.encode(),
        failure=None,
        created_at=storage.clock(),
    )
    await storage.insert_answer(answer)
    engine = sa.create_engine(migrations.sync_url(sql_store.url))
    try:
        with engine.connect() as connection:
            (kept,) = connection.execute(sa.select(sql_store.tables.child_answers.c.answer_blob))
    finally:
        engine.dispose()
    assert CARD.encode() not in bytes(kept[0])
    found = await storage.fetch_answer("child-1")
    assert found is not None
    assert found.outcome == CARD.encode()
    assert [owed.outcome for owed in await storage.undelivered_answers(10)] == [CARD.encode()]


def test_a_sealed_text_that_is_not_json_is_refused_typed(key_a: str) -> None:
    from statifier.persistence import UndecodableBlob
    from statifier.persistence.codec import opened_text, sealed_json

    codec = FernetCodec([key_a])
    assert opened_text(codec, sealed_json(codec, '["tick"]'), "an outbox row") == '["tick"]'
    for damaged in ("not json", '{"statifier.sealed": 5}'):
        with pytest.raises(UndecodableBlob, match="an outbox row is not in the encoded form"):
            opened_text(codec, damaged, "an outbox row")
    with pytest.raises(UndecodableBlob, match="an outbox row is not encoded"):
        opened_text(codec, "[]", "an outbox row")  # JSON, stored without the codec
