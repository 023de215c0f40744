"""Reading, checking and compiling SCXML charts.

>>> from statifier.chart import compile_chart
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><transition event="go" target="b"/></state><final id="b"/></scxml>'
... )
>>> [state.id for state in machine.states]
[None, 'a', 'b']
>>> machine.identity.content_hash[:7]
'sha256:'
"""

from statifier.chart.compiler import InvalidChart, Problem, compile_chart, validate
from statifier.chart.model import Machine
from statifier.chart.reader import ReadLimits

__all__ = [
    "InvalidChart",
    "Machine",
    "Problem",
    "ReadLimits",
    "compile_chart",
    "validate",
]
