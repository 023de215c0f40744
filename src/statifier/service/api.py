"""The HTTP API as the service serves it (``[api]``, ``docs/api.md``).

:func:`service_api` builds the :class:`~statifier.api.Api` over the service's router (over
every store with ``[database] shards``):
its tokens are those of ``[api.tokens.NAME]`` (each read from the environment variable
``token_env`` names), its visible fields those of ``[api.visible]``. The service
mounts ``api.app`` at ``[api] path`` on its listener and closes it when it stops, so
that no waiting call holds the stop up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statifier.router import Router, ShardedRouter
from statifier.service.settings import ServiceConfigError, ServiceSettings

if TYPE_CHECKING:
    from statifier.api import Api
    from statifier.console.stores import Stores

__all__ = ["service_api"]


def service_api(
    settings: ServiceSettings, router: Router | ShardedRouter, stores: Stores | None = None
) -> Api:
    """The API of ``settings`` (which must have ``[api]`` enabled) over ``router`` (the
    service's one database, or its stores); ``stores``: the console's, when the service
    serves one (see :class:`~statifier.api.Api`).

    Raises:
        ServiceConfigError: the API refuses the configuration (a binding named ``api``).
    """
    from statifier.api import Api, ApiToken, Rights

    chosen = settings.api
    tokens = [ApiToken(t.name, t.token, t.scopes, Rights(t.rights)) for t in chosen.tokens]
    try:
        return Api(
            router,
            tokens=tokens,
            visible=chosen.visible,
            max_body=chosen.max_body,
            timeout=chosen.timeout,
            max_wait=chosen.max_wait,
            poll=chosen.poll,
            stores=stores,
        )
    except ValueError as refused:
        raise ServiceConfigError(settings.file, "api", "", str(refused)) from None
