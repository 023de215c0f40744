"""scriba's SQL side: its tables, their migrations, and the SQL target.

Needs SQLAlchemy and Alembic (the ``scriba`` extra), plus psycopg 3 for PostgreSQL.

- :func:`define_tables` (:mod:`scriba.sql.tables`): the positions, watermarks and
  dead-letter tables under a prefix and schema.
- :func:`upgrade`, :func:`downgrade`, :func:`current_revision`
  (:mod:`scriba.sql.migrate`): versioned, idempotent Alembic migrations with their own
  version table.
- :func:`classify` (:mod:`scriba.sql.failures`): a database error's failure kind.
- :class:`SqlTarget` (:mod:`scriba.sql.target`): the target that commits a batch, its
  cursors and its dead letters in one transaction.
"""

from scriba.sql.failures import classify
from scriba.sql.migrate import HEAD, current_revision, downgrade, upgrade
from scriba.sql.tables import Tables, define_tables
from scriba.sql.target import SchemaNotReadyError, SqlTarget

__all__ = [
    "HEAD",
    "SchemaNotReadyError",
    "SqlTarget",
    "Tables",
    "classify",
    "current_revision",
    "define_tables",
    "downgrade",
    "upgrade",
]
