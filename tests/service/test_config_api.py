"""The ``[api]`` section of a ``statifier serve`` file: every key read into
:class:`ApiSettings`, the defaults, and each refusal naming its table and key without
the token."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.service.helpers import HITS, HITS_BINDING, write_config

from statifier.service import ServiceConfigError, load
from statifier.service.settings import ApiSettings, ApiTokenSettings

HEAD = f'charts = "charts"\n{HITS_BINDING}\n'
PARTNER = "partner-token-0123456789"
OPS = "ops-token-abcdefghijklmn"
ENVIRON = {"PARTNER_TOKEN": PARTNER, "OPS_TOKEN": OPS, "SHORT": "short"}

API = """
[api]
path = "/v1"
max_wait = 30
timeout = 5.5
max_body = 4096
poll = 0.5

[api.visible]
hits = ["hits"]

[api.tokens.partner]
token_env = "PARTNER_TOKEN"
scopes = ["acme", "globex"]
rights = "write"

[api.tokens.ops]
token_env = "OPS_TOKEN"
scopes = ["*"]
"""


def loaded(tmp_path: Path, body: str) -> ApiSettings:
    config = write_config(tmp_path, HEAD + body, {"hits": HITS})
    return load(config, ENVIRON).api


def refused(tmp_path: Path, body: str) -> str:
    config = write_config(tmp_path, HEAD + body, {"hits": HITS})
    with pytest.raises(ServiceConfigError) as error:
        load(config, ENVIRON)
    return str(error.value).removeprefix(f"{config}: ")


def test_the_api_section_loads_into_settings(tmp_path: Path) -> None:
    api = loaded(tmp_path, API)
    assert api == ApiSettings(
        enabled=True,
        path="/v1",
        tokens=(
            ApiTokenSettings("partner", PARTNER, ("acme", "globex"), "write"),
            ApiTokenSettings("ops", OPS, ("*",), "read"),
        ),
        visible={"hits": ("hits",)},
        max_body=4096,
        timeout=5.5,
        max_wait=30.0,
        poll=0.5,
    )
    assert PARTNER not in repr(api)
    assert OPS not in repr(api)


def test_without_the_section_no_api_is_served(tmp_path: Path) -> None:
    assert loaded(tmp_path, "") == ApiSettings()
    assert not ApiSettings().enabled


def test_the_defaults_of_the_section(tmp_path: Path) -> None:
    api = loaded(tmp_path, '[api.tokens.ops]\ntoken_env = "OPS_TOKEN"\nscopes = ["s"]\n')
    assert (api.enabled, api.path, api.max_wait, api.timeout, api.max_body) == (
        True,
        "/api",
        60.0,
        10.0,
        1 << 20,
    )
    assert api.visible == {}
    assert api.tokens[0].rights == "read"


def test_a_disabled_api_needs_no_token(tmp_path: Path) -> None:
    assert not loaded(tmp_path, "[api]\nenabled = false\n").enabled


TOKEN = '[api.tokens.t]\ntoken_env = "OPS_TOKEN"\nscopes = ["s"]\n'
WEBHOOK = '[fronts.webhook.w]\npath = "/api/hooks"\nsource = "clicks"\nscope = "s"\n'


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("[api]\n", "[api] tokens: the API needs a token"),
        (f"[api]\nport = 1\n{TOKEN}", "[api] port: unknown key"),
        (f'[api]\npath = "api"\n{TOKEN}', "[api] path: must be an absolute path such as"),
        (f'[api]\npath = "/healthz"\n{TOKEN}', '[api] path: "/healthz" overlaps the health'),
        (
            f'[api]\npath = "/console"\n[console]\n{TOKEN}',
            '[api] path: "/console" overlaps the console',
        ),
        (TOKEN + WEBHOOK, '[fronts.webhook.w] path: "/api/hooks" overlaps the API'),
        (f"[api]\nmax_wait = 0\n{TOKEN}", "[api] max_wait: must be a positive number"),
        (f"[api]\ntimeout = 'long'\n{TOKEN}", "[api] timeout: must be a positive number"),
        (f"[api]\nmax_body = 0\n{TOKEN}", "[api] max_body: must be an integer from 1"),
        (f"[api.visible]\nghost = ['x']\n{TOKEN}", "[api.visible] ghost: no chart"),
        (f"[api.visible]\nhits = 'hits'\n{TOKEN}", "[api.visible] hits: must be a list"),
        (f"[api.visible]\nhits = ['_event']\n{TOKEN}", "[api.visible] hits: must be a list"),
        ('[api.tokens.t]\nscopes = ["s"]\n', "[api.tokens.t] token_env: required"),
        (
            '[api.tokens.t]\ntoken_env = "UNSET"\nscopes = ["s"]\n',
            "[api.tokens.t] token_env: the environment variable UNSET is not set",
        ),
        (
            '[api.tokens.t]\ntoken_env = "SHORT"\nscopes = ["s"]\n',
            "[api.tokens.t] token_env: the token must be 16 to 512 characters",
        ),
        ('[api.tokens.t]\ntoken_env = "OPS_TOKEN"\n', "[api.tokens.t] scopes: required"),
        (
            '[api.tokens.t]\ntoken_env = "OPS_TOKEN"\nscopes = []\n',
            "[api.tokens.t] scopes: must be a list of scopes",
        ),
        (
            '[api.tokens.t]\ntoken_env = "OPS_TOKEN"\nscopes = "s"\n',
            "[api.tokens.t] scopes: must be a list of scopes",
        ),
        (
            '[api.tokens.t]\ntoken_env = "OPS_TOKEN"\nscopes = ["*", "s"]\n',
            '[api.tokens.t] scopes: "*" is every scope: give it alone',
        ),
        (f'{TOKEN}rights = "admin"\n', "[api.tokens.t] rights: must be one of read, write"),
        (f"{TOKEN}role = 'x'\n", "[api.tokens.t] role: unknown key"),
        (
            f'{TOKEN}[api.tokens.u]\ntoken_env = "OPS_TOKEN"\nscopes = ["s"]\n',
            "[api.tokens.u] token_env: the same token as [api.tokens.t]",
        ),
    ],
)
def test_refusals_name_the_table_and_the_key(tmp_path: Path, body: str, said: str) -> None:
    text = refused(tmp_path, body)
    assert text.startswith(said), text
    assert OPS not in text
    assert PARTNER not in text
