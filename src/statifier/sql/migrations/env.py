"""Alembic's entry point for this package's revisions.

Alembic runs this file; importing it does nothing (Alembic's ``context`` has no
``config`` outside a run).
"""

from alembic import context

from statifier.sql.migrations import run_environment

_config = getattr(context, "config", None)
if _config is not None:
    run_environment(_config)
