"""`statifier executions --keys-env`: the command reads and writes a database whose
blobs are encrypted, and without the keys it refuses in one line, on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.test_executions_command import Place, _place, cli

from statifier.persistence.fernet import FernetCodec
from statifier.sql import migrations


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    yield from _place(request, request.param, tmp_path)


def test_the_command_runs_on_encrypted_blobs_and_refuses_without_the_keys(
    place: Place, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    place.migrate()
    key = FernetCodec.generate_key()
    monkeypatch.setenv("CLI_BLOB_KEY", key)
    keyed = [*place.options, "--keys-env", "CLI_BLOB_KEY"]
    charts = ["--charts", str(place.charts)]
    assert cli(capsys, "create", "door", "--id", "d1", *keyed, *charts)[0] == 0
    sent = cli(capsys, "send", "d1", 'knock={"by": "the-postman-7b2c"}', *keyed)
    assert sent == (0, "d1: knock taken; active in open\n", "")
    status, text, _ = cli(capsys, "show", "d1", *keyed)
    assert status == 0
    assert '0  step  knock {"by": "the-postman-7b2c"}' in text

    table = f"{place.tables.schema + '.' if place.tables.schema else ''}c_inputs"
    engine = sa.create_engine(migrations.sync_url(place.url))
    try:
        with engine.connect() as connection:
            (blob,) = connection.execute(sa.text(f"SELECT input_blob FROM {table}")).one()
    finally:
        engine.dispose()
    assert b"the-postman" not in bytes(blob)

    # Without the keys the blobs are bytes that are no position: refused, with a hint.
    refused = cli(capsys, "show", "d1", *place.options)
    assert refused[0] == 2
    assert refused[2] == (
        "statifier executions show: the bytes are not a stored event "
        "(if its blobs are encrypted, give --keys-env)\n"
    )
    # With another key: the typed refusal, naming the execution.
    monkeypatch.setenv("CLI_OTHER_KEY", FernetCodec.generate_key())
    other = cli(capsys, "show", "d1", *place.options, "--keys-env", "CLI_OTHER_KEY")
    assert other[0] == 2
    assert other[2] == (
        "statifier executions show: the position of execution 'd1' could not be decoded: "
        "not a Fernet token of any configured key\n"
    )
    monkeypatch.setenv("CLI_BLOB_KEY", "s3cr3t-not-a-key")
    bad = cli(capsys, "show", "d1", *keyed)
    assert bad[0] == 2
    assert "the key in CLI_BLOB_KEY is not a Fernet key" in bad[2]
    assert "s3cr3t" not in bad[2]


def test_fire_exits_1_naming_the_fires_that_failed(
    place: Place, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer sealed under a key the command lacks cannot fire: the command says how
    many failed and exits 1, and the timer stays for a command that has the key."""
    place.migrate()
    (place.charts / "ping.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">'
        '<state id="s"><onentry><send event="tick"/></onentry>'
        '<transition event="tick" target="done"/></state><final id="done"/></scxml>',
        encoding="utf-8",
    )
    monkeypatch.setenv("CLI_BLOB_KEY", FernetCodec.generate_key())
    monkeypatch.setenv("CLI_OTHER_KEY", FernetCodec.generate_key())
    keyed = [*place.options, "--keys-env", "CLI_BLOB_KEY"]
    charts = ["--charts", str(place.charts)]
    assert cli(capsys, "create", "ping", "--id", "p1", *keyed, *charts)[0] == 0

    status, text, _ = cli(capsys, "fire", *place.options, "--keys-env", "CLI_OTHER_KEY")
    said = (
        "0 timers fired\n1 fire failed (the warnings above say why); the timers stay, "
        "due again in a few seconds\n"
    )
    assert (status, text) == (1, said)
    shown = cli(capsys, "show", "p1", *keyed)
    assert shown[0] == 0
    assert "tick" in shown[1]
