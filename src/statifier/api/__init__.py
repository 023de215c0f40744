"""The HTTP API into executions (``docs/api.md``): send an event and get the state after
the commit, wait for a state, read, list, pause, resume and cancel, each call under a
bearer token of some scopes.

:class:`Api` is the application ``statifier serve`` mounts at ``[api] path``;
:class:`ApiToken` is one caller. The Python client of the API is
:mod:`statifier.client`.
"""

from statifier.api.app import API_PLAN_ID, Api
from statifier.api.tokens import ApiToken, ApiTokenError, Rights

__all__ = ["API_PLAN_ID", "Api", "ApiToken", "ApiTokenError", "Rights"]
