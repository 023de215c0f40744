"""The event router: inbound events routed by key to durable executions.

A :class:`Binding` says which events of a source an execution of a document receives
and under which key; a :class:`Router` runs a :class:`RouterConfig` on its database, and
:meth:`Router.route` delivers an :class:`InboundEvent` to every binding whose match
holds, each delivery one transaction: the dedupe claim, the address, the
create when the binding's mode calls for one, the step, the ledger row. The reapers
clear expired dedupe claims and the addresses of executions that ended longer ago
than their horizon; a source invoke (:mod:`statifier.router.subscriptions`) subscribes
an execution to a binding while a state of it is active;
:mod:`statifier.router.scenario` runs a routing case (``statifier scenario``). What
executions send (routes, the outbox, durable timers, ``on_complete``, execution
targets) is :mod:`statifier.router.sending` and its neighbours. The fronts that read
Kafka, NATS or HTTP and call the router are :mod:`statifier.fronts`; ``statifier serve``
runs them with the workers. See ``docs/router.md`` and ``docs/router-outbound.md``.
"""

from statifier.extras import MissingExtra

try:  # first: every part of the router runs on SQLAlchemy (the sqlite or postgres extra)
    import sqlalchemy  # noqa: F401 - imported for the error it raises when missing
except ModuleNotFoundError as missing:
    raise MissingExtra.of(missing) from missing

from statifier.router.basichttp_sends import basichttp_sink
from statifier.router.binding import (
    Binding,
    Create,
    Dedupe,
    Keyed,
    Mode,
    Order,
    Plan,
    load_bindings,
)
from statifier.router.config import (
    BasicHttpLocations,
    Cap,
    CapPer,
    Entry,
    OverLimit,
    Resolved,
    RouterConfig,
    StaticResolver,
    check_on_complete,
    check_send_type,
    error_policy_of,
)
from statifier.router.contracts import Contracts, Finding
from statifier.router.errors import (
    BindingError,
    BindingsUnresolved,
    ChartUnresolved,
    ConfigError,
    ExecutionParked,
    InvalidEvent,
    RouterError,
    UnresolvedDocument,
)
from statifier.router.flow import BindingGone
from statifier.router.flow_worker import FlowWorker, FlushReport
from statifier.router.outbox import (
    SINK_SHARE,
    Backoff,
    DeadLetter,
    DrainReport,
    OutboxDrain,
    OutboxMessage,
    OutboxRoute,
    OutboxRow,
    Sink,
)
from statifier.router.outcomes import (
    Buffered,
    CreatedAndDelivered,
    Delivered,
    Dropped,
    DropReason,
    Duplicate,
    Failed,
    Held,
    InboundEvent,
    KeyRefused,
    NoMatch,
    Outcome,
    Routed,
)
from statifier.router.pausing import Resumed
from statifier.router.pins import AddressPins
from statifier.router.queries import address, address_of, ledger
from statifier.router.reapers import (
    AddressReap,
    LockReap,
    reap_addresses,
    reap_dedupe,
    reap_ledger,
    reap_locks,
)
from statifier.router.records import AddressRow, LedgerRow
from statifier.router.routing import BlockedByEarlierFailure, Planned, Router
from statifier.router.scheduler import LATE_AFTER as SCHEDULE_LATE_AFTER
from statifier.router.scheduler import FireReport, SchedulePage, Scheduler, ScheduleState
from statifier.router.schedules import CatchUp, Schedule, ScheduleError, ScheduleNotFound
from statifier.router.sending import BASICHTTP_QUEUE
from statifier.router.shards import MisplacedExecution, ShardedRouter
from statifier.router.subscriptions import Subscription, SubscriptionRefused
from statifier.router.timer_worker import FirePass, TimerWorker

__all__ = [
    "BASICHTTP_QUEUE",
    "SCHEDULE_LATE_AFTER",
    "SINK_SHARE",
    "AddressPins",
    "AddressReap",
    "AddressRow",
    "Backoff",
    "BasicHttpLocations",
    "Binding",
    "BindingError",
    "BindingGone",
    "BindingsUnresolved",
    "BlockedByEarlierFailure",
    "Buffered",
    "Cap",
    "CapPer",
    "CatchUp",
    "ChartUnresolved",
    "ConfigError",
    "Contracts",
    "Create",
    "CreatedAndDelivered",
    "DeadLetter",
    "Dedupe",
    "Delivered",
    "DrainReport",
    "DropReason",
    "Dropped",
    "Duplicate",
    "Entry",
    "ExecutionParked",
    "Failed",
    "Finding",
    "FirePass",
    "FireReport",
    "FlowWorker",
    "FlushReport",
    "Held",
    "InboundEvent",
    "InvalidEvent",
    "KeyRefused",
    "Keyed",
    "LedgerRow",
    "LockReap",
    "MisplacedExecution",
    "Mode",
    "NoMatch",
    "Order",
    "OutboxDrain",
    "OutboxMessage",
    "OutboxRoute",
    "OutboxRow",
    "Outcome",
    "OverLimit",
    "Plan",
    "Planned",
    "Resolved",
    "Resumed",
    "Routed",
    "Router",
    "RouterConfig",
    "RouterError",
    "Schedule",
    "ScheduleError",
    "ScheduleNotFound",
    "SchedulePage",
    "ScheduleState",
    "Scheduler",
    "ShardedRouter",
    "Sink",
    "StaticResolver",
    "Subscription",
    "SubscriptionRefused",
    "TimerWorker",
    "UnresolvedDocument",
    "address",
    "address_of",
    "basichttp_sink",
    "check_on_complete",
    "check_send_type",
    "error_policy_of",
    "ledger",
    "load_bindings",
    "reap_addresses",
    "reap_dedupe",
    "reap_ledger",
    "reap_locks",
]
