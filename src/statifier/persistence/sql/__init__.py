"""Durable executions on PostgreSQL and SQLite: :class:`SqlAdapter`.

- :mod:`statifier.persistence.sql.adapter`: the front, :class:`SqlAdapter` (opening
  the database, views, :meth:`SqlAdapter.transaction`), handing each call to
- :mod:`statifier.persistence.sql.postgres` (psycopg 3) or
  :mod:`statifier.persistence.sql.sqlite` (``sqlite3``): the statements of
  :mod:`statifier.sql` run on the driver, with the lock and the transactions;
- :mod:`statifier.persistence.sql.schema`: what the statements are written against
  (the tables of :mod:`statifier.sql`, their names in SQL text).

Engines, URLs and SQLite's settings come from :mod:`statifier.sql.engines`, which scriba
shares. A database without the tables raises :class:`statifier.sql.TablesMissing`
(run ``statifier db upgrade``); a missing library, :class:`statifier.extras.MissingExtra`
naming the extra to install.
"""

from statifier.extras import MissingExtra

try:
    from statifier.persistence.sql.adapter import SqlAdapter, SqlTransaction
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = ["SqlAdapter", "SqlTransaction"]
