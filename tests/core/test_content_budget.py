"""The budget of executable content one call of the core may run (MAX_CONTENT_STEPS).

The counts below follow the rule the budget documents: every element run counts one,
every ``<foreach>`` iteration one more, and the element that would go past the budget
is not run. The tests count work, never time.
"""

from __future__ import annotations

from collections.abc import Sequence

from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.content import CONTENT_BUDGET_EXCEEDED, MAX_CONTENT_STEPS
from statifier.expr import Value

NS = "http://www.w3.org/2005/07/scxml"
SIZE = 1_000
NESTED = (
    '<foreach array="xs" item="a"><foreach array="xs" item="b">'
    '<assign location="n" expr="n + 1"/></foreach></foreach>'
)


def chart(body: str) -> Machine:
    return compile_chart(
        f'<scxml xmlns="{NS}"><datamodel><data id="xs"/><data id="n" expr="0"/>'
        f'<data id="entries" expr="0"/></datamodel>{body}</scxml>'
    )


def options(round_budget: int | None = StartOptions().round_budget) -> StartOptions:
    return StartOptions(datamodel={"xs": list(range(SIZE))}, round_budget=round_budget)


def errors(effects: Sequence[fx.Effect]) -> list[dict[str, Value]]:
    """The data of every error.execution the effects report."""
    found = []
    for effect in effects:
        if isinstance(effect, fx.ChartError) and effect.event.name == "error.execution":
            assert isinstance(effect.event.data, dict)
            found.append(effect.event.data)
    return found


def nested_run(spent_before: int) -> tuple[int, str]:
    """What :data:`NESTED` gets through when ``spent_before`` of the budget is gone:
    the assignments it runs and the element the budget stops."""
    left = MAX_CONTENT_STEPS - spent_before

    def charge() -> bool:
        nonlocal left
        left -= 1
        return left >= 0

    assignments = 0
    if not charge():  # the outer foreach
        return assignments, "foreach"
    for _ in range(SIZE):
        if not (charge() and charge()):  # its iteration, the inner foreach
            return assignments, "foreach"
        for _ in range(SIZE):
            if not charge():  # the inner iteration
                return assignments, "foreach"
            if not charge():
                return assignments, "assign"
            assignments += 1
    raise AssertionError("the nested loop fits in the budget: make SIZE larger")


def test_the_budget_stops_a_nested_foreach_at_the_budget() -> None:
    machine = chart(
        f'<state id="s"><onentry>{NESTED}<log label="after" expr="n"/></onentry></state>'
    )
    state, effects = initialize(machine, options())
    assignments, stopped = nested_run(0)
    assert assignments < SIZE * SIZE
    assert state.datamodel["n"] == assignments
    # The block was aborted where the budget ran out: the log after the loop never ran.
    assert not [e for e in effects if isinstance(e, fx.Log)]
    [error] = errors(effects)
    assert error["reason"] == CONTENT_BUDGET_EXCEEDED
    assert error["element"] == stopped
    assert error["message"] == (
        f"the step ran more than {MAX_CONTENT_STEPS} elements of executable content"
    )
    assert error["line"] == 1
    assert isinstance(error["column"], int)
    assert state.running
    assert state.leaf_configuration() == ("s",)


def test_a_foreach_with_an_empty_body_counts_its_iterations() -> None:
    machine = chart(
        '<state id="s"><onentry><foreach array="xs" item="a">'
        '<foreach array="xs" item="b"/></foreach></onentry></state>'
    )
    _, effects = initialize(machine, options())
    [error] = errors(effects)
    assert (error["reason"], error["element"]) == (CONTENT_BUDGET_EXCEEDED, "foreach")
    writes = [e for e in effects if isinstance(e, fx.DatamodelChange)]
    assert len(writes) <= MAX_CONTENT_STEPS + 10


def looping_chart() -> Machine:
    """On ``go``, a state whose entry loops until the budget runs out and whose
    error.execution transition enters it again."""
    return chart(
        '<state id="idle"><transition event="go" target="loop"/></state>'
        '<state id="loop"><onentry><assign location="entries" expr="entries + 1"/>'
        f"{NESTED}</onentry>"
        '<transition event="error.execution" target="loop"/></state>'
    )


def test_reentering_the_loop_on_the_error_does_not_multiply_the_work() -> None:
    state, _ = initialize(looping_chart(), options(round_budget=50))
    state, effects = handle_event(state, Event("go"))
    assignments, _ = nested_run(1)  # after the assignment of entries
    # The first entry spent the budget; every later entry aborted at its first element
    # until the round budget ended the macrostep.
    assert state.datamodel["entries"] == 1
    assert state.datamodel["n"] == assignments
    assert len([e for e in effects if isinstance(e, fx.BudgetExhausted)]) == 1
    found = errors(effects)
    assert 1 < len(found) <= 50
    assert {(e["reason"], e["element"]) for e in found[1:]} == {(CONTENT_BUDGET_EXCEEDED, "assign")}
    assert len(effects) < MAX_CONTENT_STEPS + 1_000

    # The next call starts with a fresh budget: the entry runs again, as far as before.
    state, effects = handle_event(state, Event("poke"))
    assert state.datamodel["entries"] == 2
    assert state.datamodel["n"] == 2 * assignments


def test_each_call_has_its_own_budget() -> None:
    # 2 * 20,000 + 1 elements per event: together past the budget, each within it.
    machine = chart(
        '<state id="s"><transition event="work"><foreach array="xs" item="a">'
        '<assign location="n" expr="n + 1"/></foreach></transition></state>'
    )
    state, _ = initialize(machine, StartOptions(datamodel={"xs": list(range(20_000))}))
    collected: list[fx.Effect] = []
    for _ in range(3):
        state, effects = handle_event(state, Event("work"))
        collected += effects
    assert state.datamodel["n"] == 60_000
    assert not errors(collected)


def test_an_ordinary_foreach_is_unaffected() -> None:
    machine = chart(
        '<state id="s"><onentry><foreach array="xs" item="a" index="i">'
        '<assign location="n" expr="n + a"/><log label="i" expr="i"/></foreach>'
        '<log label="after" expr="n"/></onentry></state>'
    )
    state, effects = initialize(machine, options())
    assert state.datamodel["n"] == sum(range(SIZE))
    logs = [(e.label, e.value) for e in effects if isinstance(e, fx.Log)]
    assert logs == [*(("i", i) for i in range(SIZE)), ("after", sum(range(SIZE)))]
    assert not errors(effects)


def test_a_scripts_loops_are_charged_to_the_budget() -> None:
    # Each script may loop 10,000 times; a <foreach> of 1,000 scripts would loop ten
    # million times without the charge. Charged, the budget stops the foreach after
    # about ten scripts (each costs its element, the iteration and 9,999 loops).
    machine = chart(
        '<state id="s"><onentry><foreach array="xs" item="a"><script>'
        "i = 0; while i &lt; 9999 { i = i + 1 }; n = n + 1</script></foreach>"
        "</onentry></state>"
    )
    state, effects = initialize(machine, options())
    [error] = errors(effects)
    assert error["reason"] == CONTENT_BUDGET_EXCEEDED
    per_script = 9_999 + 2
    assert state.datamodel["n"] == MAX_CONTENT_STEPS // per_script + 1
