"""The pure statechart interpreter: ``(position, event) -> (position, effects)``.

>>> from statifier.chart import compile_chart
>>> from statifier.core import Event, handle_event, initialize
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">'
...     '<state id="idle"><transition event="start" target="busy"/></state>'
...     '<state id="busy"><onentry><log label="entered" expr="1 + 1"/></onentry></state>'
...     '</scxml>'
... )
>>> state, effects = initialize(machine)
>>> state.leaf_configuration()
('idle',)
>>> state, effects = handle_event(state, Event("start"))
>>> state.leaf_configuration(), [(e.label, e.value) for e in effects]
(('busy',), [('entered', 2)])
"""

from statifier.core.events import Event
from statifier.core.interpreter import MachineNotRunning, handle_event, initialize
from statifier.core.state import MachineState, StartOptions

__all__ = [
    "Event",
    "MachineNotRunning",
    "MachineState",
    "StartOptions",
    "handle_event",
    "initialize",
]
