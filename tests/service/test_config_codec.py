"""``[codec]`` of ``statifier serve``'s configuration: the keys come from the
environment, the router's storage encrypts with them, and every refusal names the
table and the key, never a key's value."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.service.helpers import write_config

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import PLAIN, Executions
from statifier.persistence.fernet import FernetCodec
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router
from statifier.router.timers import SqlTimerQueue
from statifier.service import ServiceConfigError, load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions, migrations

CODEC = '[codec]\nkind = "fernet"\nkeys_env = ["BLOB_KEY_NEW", "BLOB_KEY_OLD"]\n'
MARKER = "SERVE-MARKER-9d1e"
NOTED = f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="note" expr="'{MARKER}'"/><data id="hits" expr="0"/></datamodel>
  <state id="open">
    <transition event="hit"><assign location="hits" expr="hits + 1"/></transition>
  </state>
</scxml>"""


def test_without_a_codec_table_blobs_are_stored_as_given(tmp_path: Path) -> None:
    assert load(write_config(tmp_path, ""), {}).codec is PLAIN


@pytest.mark.asyncio
async def test_the_router_storage_encrypts_with_the_newest_key(tmp_path: Path) -> None:
    new, old = FernetCodec.generate_key(), FernetCodec.generate_key()
    settings = load(write_config(tmp_path, CODEC), {"BLOB_KEY_NEW": new, "BLOB_KEY_OLD": old})
    assert isinstance(settings.codec, FernetCodec)
    assert new not in repr(settings)
    assert old not in repr(settings)
    url = f"sqlite:///{tmp_path / 'served.db'}"
    options = TableOptions(prefix="svc_")
    migrations.upgrade(url, options)
    chart = compile_chart(NOTED)
    async with SqlAdapter(url, options) as adapter:
        router = Router(router_config(settings, adapter))
        assert router.storage.codec is settings.codec
        assert isinstance(router.timers, SqlTimerQueue)
        assert router.timers.codec is settings.codec  # timer payloads sealed too
        await Executions(router.storage).create("served-1", chart)
        await Executions(router.storage).step("served-1", chart, Event("hit"))
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            (position,) = connection.execute(
                sa.text("SELECT position_blob FROM svc_executions")
            ).one()
    finally:
        engine.dispose()
    assert MARKER.encode() not in position
    assert FernetCodec([new]).decode(position)


@pytest.mark.parametrize(
    ("body", "environ", "said"),
    [
        (
            '[codec]\nkind = "aes"\nkeys_env = ["K"]\n',
            {},
            '[codec] kind: must be one of fernet, not "aes"',
        ),
        ('[codec]\nkeys_env = ["K"]\n', {}, "[codec] kind: required"),
        ('[codec]\nkind = "fernet"\n', {}, "[codec] keys_env: required"),
        (
            '[codec]\nkind = "fernet"\nkeys_env = "K"\n',
            {},
            (
                "[codec] keys_env: must be a list of environment variable names, the newest key "
                'first, not "K"'
            ),
        ),
        (
            '[codec]\nkind = "fernet"\nkeys_env = ["K"]\nkey = "abc"\n',
            {},
            "[codec] key: unknown key",
        ),
        (
            '[codec]\nkind = "fernet"\nkeys_env = ["K"]\n',
            {},
            "[codec] keys_env: the environment variable K holds no Fernet key",
        ),
        (
            '[codec]\nkind = "fernet"\nkeys_env = ["K"]\n',
            {"K": "s3cr3t-but-not-a-key"},
            (
                "[codec] keys_env: the key in K is not a Fernet key (32 bytes in url-safe base64, "
                "as FernetCodec.generate_key() makes)"
            ),
        ),
    ],
)
def test_codec_refusals_name_the_table_and_the_key_never_the_value(
    tmp_path: Path, body: str, environ: dict[str, str], said: str
) -> None:
    config = write_config(tmp_path, body)
    with pytest.raises(ServiceConfigError) as error:
        load(config, environ)
    text = str(error.value)
    assert text == f"{config}: {said}"
    for value in environ.values():
        assert value not in text
