"""``Durable``, the shortest way in to durable executions: one object built from a database URL and
charts, with ``create``, ``send`` (and ``send_many``), ``describe``, ``list``, ``cancel``
and ``migrate``.

:class:`Durable` opens the SQL adapter (:mod:`statifier.persistence.sql`), checks that
the tables are migrated (or migrates them when asked), compiles the charts it is given
by name, and returns plain frozen values: :class:`Description`, :class:`Sent`,
:class:`Cancelled`, :class:`ExecutionSummary`, :class:`Moved`. Underneath it is the lifecycle of
:mod:`statifier.persistence` (:class:`~statifier.persistence.Executions` over a
:class:`~statifier.persistence.Storage`), reachable as :attr:`Durable.executions`. See
``docs/durable.md``.

The package's modules: ``front`` (:class:`Durable`), ``values`` (what it returns, read
off stored positions), ``charts`` (compiling the charts it is given), ``database``
(checking or migrating the tables) and ``errors``.

>>> import asyncio, os, tempfile
>>> door = (
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<state id="open"><transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'app.db')}"
>>> async def main():
...     async with Durable(url, charts={"door": door}, migrate=True) as durable:
...         await durable.create("door", "door_1")
...         sent = await durable.send("door_1", "close")
...         return sent.status.value, (await durable.describe("door_1")).final_state
>>> asyncio.run(main())
('completed', 'closed')

This module sits above :mod:`statifier.router`: on a SQL database its calls step
through the router's transaction, so the timers and the outbox of durable executions
are the router's (:meth:`Durable.run` fires and drains them). SQLAlchemy, Alembic, the
router and the database drivers are imported when a :class:`Durable` opens, not on
import.
"""

from statifier.durable.database import NotMigrated
from statifier.durable.errors import ChartUnusable, DurableError, UnknownChart
from statifier.durable.front import MAX_SENDS, Durable
from statifier.durable.values import (
    Cancelled,
    Description,
    ExecutionSummary,
    Moved,
    Send,
    Sent,
)
from statifier.persistence import (
    ExecutionExists,
    ExecutionNotFound,
    InvalidMigrationPlan,
    LockTimeout,
    MigrationSummary,
    Status,
    Unstorable,
)

__all__ = [
    "MAX_SENDS",
    "Cancelled",
    "ChartUnusable",
    "Description",
    "Durable",
    "DurableError",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionSummary",
    "InvalidMigrationPlan",
    "LockTimeout",
    "MigrationSummary",
    "Moved",
    "NotMigrated",
    "Send",
    "Sent",
    "Status",
    "UnknownChart",
    "Unstorable",
]
