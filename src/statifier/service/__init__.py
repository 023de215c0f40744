"""``statifier serve CONFIG.toml``: the router, its fronts and its workers as one
service process.

:func:`~statifier.service.config.load` reads and checks the configuration file
(:mod:`statifier.service.config`); :class:`~statifier.service.service.Service` runs
what it names on one event loop: the HTTP fronts under uvicorn
(:mod:`statifier.service.mounts`) beside the health endpoints
(:mod:`statifier.service.health`), the stream consumers
(:mod:`statifier.service.consumers`), the timer worker, the outbox drain with its sinks
(:mod:`statifier.service.sinks`) and the reapers. :func:`serve` is the command. See
``docs/serve.md``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from statifier.service.config import ServiceConfigError, ServiceSettings, load
from statifier.service.service import NotMigrated, Service

__all__ = ["NotMigrated", "Service", "ServiceConfigError", "ServiceSettings", "load", "serve"]


def serve(path: Path | str, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """Load the configuration at ``path`` and run the service until SIGTERM or SIGINT;
    answers the exit status (0: stopped in order, 1: cut short by
    ``shutdown_timeout``). Logs go to standard error (unless the host configured
    logging already); ``out`` hears where the service listens and when it stopped.

    Raises:
        ServiceConfigError: the file is refused.
        NotMigrated: the database is not migrated, and the file does not ask for it.
        OSError: the listener cannot be bound.
        MissingExtra: a library the configuration needs is not installed.
    """
    settings = load(path, environ)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(Service(settings, out).run())
