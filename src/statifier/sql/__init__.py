"""The SQL schema of durable executions: table definitions and their migrations.

:mod:`statifier.sql.tables` defines the tables (SQLAlchemy Core) under a
:class:`TableOptions` (prefix, schema, leading host columns, key type);
:mod:`statifier.sql.migrations` builds them with Alembic, from Python, from a host's
own Alembic environment, or with ``statifier db upgrade``.

>>> from statifier.sql import Tables
>>> Tables.define(prefix="app_").charts.name
'app_charts'
"""

from statifier.sql.tables import DEFAULT_PREFIX, TableOptions, Tables, UtcDateTime

__all__ = ["DEFAULT_PREFIX", "TableOptions", "Tables", "UtcDateTime"]
