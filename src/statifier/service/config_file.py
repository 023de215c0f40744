"""The configuration file of ``statifier serve``: its TOML schema, and :func:`load`,
which reads and checks it in full before anything starts.

One file names everything the service runs (``docs/serve.md`` shows a whole one)::

    migrate = true                      # run the migrations at start (default: refuse)
    shutdown_timeout = 10               # seconds to drain on SIGTERM
    send_type = "myapp:route"           # the type whose send targets name routes
    charts = "charts"                   # every charts/NAME.scxml is document NAME
    bindings = "bindings.toml"          # or [[bindings]] tables here

    [database]
    url_env = "DATABASE_URL"            # or url = "sqlite:///statifier.db" (the default)

    [codec]                             # blobs encrypted at rest (extra crypto)
    kind = "fernet"
    keys_env = ["BLOB_KEY_NEW", "BLOB_KEY_OLD"]  # the newest key first

    [http]
    port = 8080                         # on 127.0.0.1 unless host says otherwise

    [routes.joined_records]
    queue = "joined"                    # an outbox queue

    [sinks.joined]
    url = "https://example.com/joined"  # POSTed, with the row's Idempotency-Key

    [fronts.webhook.carrier]
    path = "/hooks/carrier"
    source = "carrier"
    scope = "depot_7"

    [sources.scans]
    kind = "kafka"
    scope = "depot_7"
    brokers_env = "KAFKA_BROKERS"
    topics = ["parcel-scans"]

    [schedules.nightly]                 # a fire at 02:00 Paris time, routed
    cron = "0 2 * * *"                  # as an event from source "clock"
    timezone = "Europe/Paris"
    source = "clock"
    scope = "depot_7"

    [console]                           # the operator console at /console
    [console.operators.ada]
    token_env = "ADA_TOKEN"
    role = "operator"                   # or "read_only"

Every mistake is a :class:`~statifier.service.settings.ServiceConfigError` naming the
file, the table and the key (``statifier.toml: [fronts.webhook.carrier] max_body: must
be a positive integer, not "big"``); a key the schema does not know is one too, so a
typo never passes silently.
The file is read up to :data:`~statifier.service.toml_reader.MAX_CONFIG_BYTES`. A
secret is named, never written: ``secret_env = "NAME"`` reads the environment variable
``NAME`` when the file is loaded, and neither errors nor ``repr`` ever show its value
(nor a database URL's).

:func:`load` returns a :class:`~statifier.service.settings.ServiceSettings`: plain
frozen values, the charts compiled and the bindings built, but nothing opened. Each
table is read by :mod:`statifier.service.sections`, sources' own options too (their
modules are imported only when the service starts one);
:func:`statifier.service.wiring.router_config` builds the
:class:`~statifier.router.RouterConfig` over an open adapter.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "statifier.toml"
>>> _ = path.write_text('[http]\\nhots = "0.0.0.0"\\n')
>>> load(path)
Traceback (most recent call last):
...
statifier.service.settings.ServiceConfigError: .../statifier.toml: [http] hots: unknown key
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from statifier.service.sections import SectionReader
from statifier.service.settings import ServiceConfigError, ServiceSettings
from statifier.service.toml_reader import Table, read_bounded, toml_document

__all__ = ["load"]


def load(path: Path | str, environ: Mapping[str, str] | None = None) -> ServiceSettings:
    """Read and check the configuration file at ``path``; secrets named by ``*_env``
    keys are read from ``environ`` (the process's environment by default). Relative
    paths in the file (charts, bindings) are relative to the file's directory.

    Raises:
        ServiceConfigError: the file cannot be read, is larger than
            :data:`~statifier.service.toml_reader.MAX_CONFIG_BYTES`, is not TOML (or
            nests arrays or inline tables too deeply, or spells an integer in more
            digits than can be read), or any value is refused.
    """
    file = str(path)
    chosen = Path(path)
    data = read_bounded(chosen, file, "")
    try:
        raw = toml_document(data)
    except ValueError as error:
        raise ServiceConfigError(file, "", "", str(error)) from None
    chosen_environ = os.environ if environ is None else environ
    reader = SectionReader(file, chosen.parent, chosen_environ)
    return reader.settings(Table(file, chosen_environ, "", raw))
