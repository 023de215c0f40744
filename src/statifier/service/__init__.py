"""``statifier serve CONFIG.toml``: the router, its fronts and its workers as one
service process.

:func:`~statifier.service.config_file.load` reads and checks the configuration file
(:mod:`statifier.service.config_file`) into settings (:mod:`statifier.service.settings`);
:class:`~statifier.service.service.Service` runs what it names on one event loop: the
HTTP fronts under uvicorn (:mod:`statifier.service.mounts`) beside the health endpoints
(:mod:`statifier.service.health`), the stream consumers
(:mod:`statifier.service.consumers`), the timer worker, the outbox drain with its sinks
(:mod:`statifier.service.sinks`) and the reapers. :func:`serve` is the command, and
:func:`configure_logging` how it sets up its logs (``[logging]``). See
``docs/serve.md``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from statifier.extras import MissingExtra

try:
    from statifier.service.config_file import load
    from statifier.service.service import NotMigrated, Service
    from statifier.service.settings import LoggingSettings, ServiceConfigError, ServiceSettings
    from statifier.service.wiring import router_config
except ModuleNotFoundError as missing:  # the SQL layer, Starlette and uvicorn: their extras
    raise MissingExtra.of(missing) from missing

__all__ = [
    "NotMigrated",
    "Service",
    "ServiceConfigError",
    "ServiceSettings",
    "configure_logging",
    "load",
    "router_config",
    "serve",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The lines of ``format = "text"``."""


def serve(path: Path | str, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """Load the configuration at ``path`` and run the service until SIGTERM or SIGINT;
    returns the exit status (0: stopped in order, 1: cut short by
    ``shutdown_timeout``, 3: stopped by itself because a store no longer held its
    place: a reshard began). Logs go to standard error (unless the host configured
    logging already); ``out`` hears where the service listens and when it stopped.

    Raises:
        ServiceConfigError: the file is refused.
        NotMigrated: the database is not migrated, and the file does not ask for it.
        OSError: the listener cannot be bound.
        MissingExtra: a library the configuration needs is not installed.
    """
    settings = load(path, environ)
    configure_logging(settings.logging)
    return asyncio.run(Service(settings, out).run())


def configure_logging(settings: LoggingSettings, stream: TextIO | None = None) -> None:
    """Send the root logger's records to ``stream`` (standard error by default) at
    ``settings.level``: as :data:`TEXT_FORMAT` lines, or with ``format = "json"`` as
    one JSON object a line (:class:`~statifier.observability.JsonFormatter`: secret-
    named fields dropped, credentials in messages masked). Does nothing when the root
    logger has handlers already: the host configured logging itself. Text lines mask
    credentials too (:class:`~statifier.observability.ScrubbingFormatter`).
    """
    from statifier.observability import JsonFormatter, ScrubbingFormatter

    level = logging.getLevelNamesMapping()[settings.level.upper()]
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(ScrubbingFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
