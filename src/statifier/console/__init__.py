"""The operator console: executions, routing, failures and projections in a browser.

Served by ``statifier serve`` (a ``[console]`` table) and by
``statifier console --database URL``.
"""
