"""The counter workload the router's and the fronts' benchmarks share: one state whose
self-transition on ``tick`` adds one to a datamodel counter, and the binding that keys
every ``bench`` event by ``event.key`` to an execution of it."""

from __future__ import annotations

from statifier.router import Binding

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="counting">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="counting">
    <transition event="tick" target="counting">
      <assign location="count" expr="count + 1"/>
    </transition>
  </state>
</scxml>
"""
DOCUMENT = "counter"
SOURCE = "bench"
BINDING = Binding(
    id="ticks",
    source=SOURCE,
    match="true",
    key="event.key",
    document=DOCUMENT,
    event="tick",
)
