"""The HTTP fronts a configuration names, built as the ASGI apps the service mounts.

``[fronts.webhook.NAME]`` is :func:`statifier.fronts.webhook.webhook_app`,
``[fronts.form.NAME]`` :func:`statifier.fronts.webhook.form_app`, and
``[fronts.basichttp.NAME]`` :func:`statifier.fronts.basichttp.basichttp_app`; an
``hmac`` table gives the webhook and form fronts a
:func:`statifier.fronts.verifiers.hmac_sha256` verifier. A front's module is imported
only when a front of its kind is configured.

:class:`Mounted` dispatches a request to the front whose path it is at or under (a
front answers ``POST /``, so ``POST /hooks/carrier`` and ``POST /hooks/carrier/`` both
reach the front at ``/hooks/carrier``, with no redirect a provider would not follow),
and everything else to the service's own app (the health endpoints).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from statifier.router import Router, ShardedRouter
from statifier.service.settings import (
    BasicHttpFront,
    Front,
    HmacSettings,
    ServiceConfigError,
    WebhookFront,
    front_table,
)

__all__ = ["Mounted", "front_app"]


def front_app(front: Front, router: Router | ShardedRouter, file: str) -> Any:
    """The ASGI app of ``front``, routing through ``router``.

    Raises:
        ServiceConfigError: the front refuses its settings (named at its table).
    """
    try:
        return _built(front, router)
    except ValueError as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise ServiceConfigError(file, front_table(front), "", message) from None


def _built(front: Front, router: Router | ShardedRouter) -> Any:
    if isinstance(front, BasicHttpFront):
        from statifier.fronts.basichttp import basichttp_app

        return basichttp_app(router, max_body=front.max_body, timeout=front.timeout)
    from statifier.fronts.webhook import form_app, webhook_app

    verifier = None if front.hmac is None else _verifier(front.hmac)
    if isinstance(front, WebhookFront):
        return webhook_app(
            router,
            source=front.source,
            scope=front.scope,
            provider_id_header=front.provider_id_header,
            verifier=verifier,
            max_body=front.max_body,
            timeout=front.timeout,
            group_commit=front.group_commit,
        )
    return form_app(
        router,
        source=front.source,
        scope=front.scope,
        verifier=verifier,
        max_body=front.max_body,
        timeout=front.timeout,
        group_commit=front.group_commit,
    )


def _verifier(settings: HmacSettings) -> Any:
    from statifier.fronts.verifiers import hmac_sha256

    encoding: Literal["hex", "base64"] = "base64" if settings.encoding == "base64" else "hex"
    return hmac_sha256(
        settings.secret,
        header=settings.header,
        encoding=encoding,
        prefix=settings.prefix,
        timestamp_header=settings.timestamp_header,
        tolerance=settings.tolerance,
    )


class Mounted:
    """An ASGI app: each front at its path, the rest to ``fallback``.

    Args:
        fronts: ``(path, app)`` pairs; no path is at or under another (the
            configuration refuses overlaps).
        fallback: the app of every other path.
    """

    def __init__(self, fronts: Sequence[tuple[str, ASGIApp]], fallback: ASGIApp) -> None:
        self.fronts = tuple(fronts)
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            for prefix, app in self.fronts:
                if path == prefix or path.startswith(prefix + "/"):
                    inner = dict(scope)
                    inner["root_path"] = scope.get("root_path", "") + prefix
                    if path == prefix:  # the front's own root, without the slash
                        inner["path"] = prefix + "/"
                        inner["raw_path"] = inner["path"].encode("ascii", "replace")
                    await app(inner, receive, send)
                    return
        await self.fallback(scope, receive, send)
