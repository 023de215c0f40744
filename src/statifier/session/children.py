"""What an ``<invoke type="scxml">`` starts: the child's chart and the datamodel it is
seeded with. Live sessions and the durable ``Driver`` start children alike through these.

>>> from statifier.core import effects as fx
>>> chart = (
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">'
...     '<datamodel><data id="limit"/></datamodel><state id="s"/></scxml>'
... )
>>> at = {"macrostep": 1, "microstep": 1, "round": 1, "state_index": 1, "invoke_index": 0}
>>> invoke = fx.Invoke(
...     invoke_id="i", type="scxml", src=None, content=chart, data={"limit": 3, "x": 1},
...     autoforward=False, **at,
... )
>>> machine = invoked_chart(invoke, loader=None)
>>> seeded_datamodel(machine, invoke.data)
{'limit': 3}
>>> from dataclasses import replace
>>> invoked_chart(replace(invoke, content=None, src="child.scxml"), loader=None)
"<invoke src='child.scxml'> is never fetched without a loader"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.core import effects as fx
from statifier.expr import Function, Value

Loader = Callable[[str], str]


def invoked_chart(
    effect: fx.Invoke, loader: Loader | None, functions: Mapping[str, Function] | None = None
) -> Machine | str:
    """The chart ``effect`` invokes, from its inline content or its ``src`` through
    ``loader``, compiled with the host's expression ``functions`` (an invoking chart's
    children call what it calls); or why there is none (the invocation then fails with
    that reason). A loader's exception is such a reason, not an error of the caller."""
    source = effect.content if isinstance(effect.content, str) else None
    if source is None and effect.src is not None:
        if loader is None:
            return f"<invoke src={effect.src!r}> is never fetched without a loader"
        try:
            source = loader(effect.src)
        except Exception as error:  # noqa: BLE001 - the loader is host code
            return f"cannot load {effect.src!r}: {error}"
    if source is None:
        return "the invoke names no chart"
    try:
        return compile_chart(source, functions=functions)
    except InvalidChart as invalid:
        return f"the invoked chart is invalid: {invalid}"


def seeded_datamodel(machine: Machine, data: Value) -> dict[str, Value]:
    """The values of ``data`` (the invoke's namelist and params) that ``machine``
    declares: a child's ``<data>`` takes them in place of its own ``expr``."""
    declared = {element.id for element in machine.data}
    given = data if isinstance(data, dict) else {}
    return {name: value for name, value in given.items() if name in declared}
