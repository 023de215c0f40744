"""Durable executions on PostgreSQL and SQLite: :class:`SqlAdapter`.

- :mod:`statifier.persistence.sql.adapter`: the front, :class:`SqlAdapter` (opening
  the database, views, :meth:`SqlAdapter.transaction`), handing each call to
- :mod:`statifier.persistence.sql.postgres` (psycopg 3) or
  :mod:`statifier.persistence.sql.sqlite` (``sqlite3``): the statements as SQL text with
  named parameters, run on the driver, with the lock and the transactions;
- :mod:`statifier.persistence.sql.schema`: what the statements are written against
  (the tables of :mod:`statifier.sql`, their names in SQL text).

Engines, URLs and SQLite's settings come from :mod:`statifier.sql.engines`, which scriba
shares.
"""

from statifier.persistence.sql.adapter import SqlAdapter, SqlTransaction

__all__ = ["SqlAdapter", "SqlTransaction"]
