"""The storage layer: statifier's tables, their migrations and every statement run on
them, for PostgreSQL and SQLite.

:mod:`statifier.sql.tables` defines the tables (SQLAlchemy Core) under a
:class:`TableOptions` (prefix, schema, leading host columns, key type);
:mod:`statifier.sql.migrations` builds them with Alembic, from Python, from a host's
own Alembic environment, or with ``statifier db upgrade``. A database without them
raises :class:`TablesMissing` (from the SQL adapter), whose message says to run
``statifier db upgrade``. The statements live one module per table family
(:mod:`statifier.sql.executions`, :mod:`statifier.sql.routing`,
:mod:`statifier.sql.timers`, :mod:`statifier.sql.outbox`, ...), each written once and
bound, converted and run by the database's :class:`~statifier.sql.dialect.Dialect`
(decision 0095). Without SQLAlchemy, importing this package raises
:class:`statifier.extras.MissingExtra` naming the ``sqlite`` extra.

>>> from statifier.sql import Tables
>>> Tables.define(prefix="app_").charts.name
'app_charts'
"""

from statifier.extras import MissingExtra

try:
    from statifier.sql.engines import TablesMissing
    from statifier.sql.tables import TableOptions, Tables
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = ["TableOptions", "Tables", "TablesMissing"]
