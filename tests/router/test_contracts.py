"""Publish-time contracts (`statifier.router.contracts.check`) and `statifier check`:
every list and reason, located at the `<send>` element's start, over multi-line
charts. No database is opened: the check is pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statifier import cli
from statifier.chart import Machine, compile_chart
from statifier.core import StartOptions
from statifier.persistence import Refused
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, RouterConfig, StaticResolver
from statifier.router.contracts import Contracts, Finding, Location, accepts, check
from statifier.router.contracts import undeclared_binding_events as binding_events
from statifier.router.routes import RouteEntry

ROUTER = "myapp:router"

PARCEL = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="at_depot">
  <state id="at_depot">
    <transition event="parcel.scanned" target="in_transit"/>
  </state>
  <state id="in_transit">
    <transition event="parcel.delivered" target="delivered"/>
    <transition event="parcel.returned" target="returned"/>
  </state>
  <final id="delivered"/>
  <final id="returned"/>
</scxml>"""
"""The receiver: its chart takes parcel.scanned, parcel.delivered, parcel.returned."""

DEPOT = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="holding">
  <state id="holding">
    <transition event="courier.nobody_home">
      <send type="myapp:router" target="execution" event="parcel.returned">
        <param name="document" expr="'parcel'"/>
        <param name="key" expr="_event.data.parcel_id"/>
      </send>
    </transition>
  </state>
</scxml>"""
"""The sender: one execution-target send of parcel.returned to `parcel`, at 4:7."""

EVERYTHING = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">
<datamodel><data id="who" expr="'parcel'"/><data id="wait" expr="'1s'"/></datamodel>
<state id="a">
  <onentry>
    <send type="myapp:courier" event="courier.called"/>
        <send typeexpr="'myapp:' + who" event="x"/>
  </onentry>
  <transition event="go">
    <send type="myapp:router" targetexpr="who" event="y"/>
    <if cond="true">
       <send type="myapp:router" target="nowhere" event="photo.lost"/>
    <else/>
      <send type="myapp:router" event="no.target"/>
    </if>
    <send type="myapp:router" target="doorstep_photos" delay="5s" event="photo.taken"/>
    <send type="myapp:router" target="doorstep_photos" delayexpr="wait" event="photo.later"/>
    <send type="myapp:router" target="doorstep_photos" delay="0s" event="photo.now"/>
  </transition>
  <transition event="send">
    <foreach array="[1]" item="i">
      <send type="myapp:router" target="execution" eventexpr="who">
        <param name="document" expr="'parcel'"/>
      </send>
    </foreach>
    <send type="myapp:router" target="execution"><content expr="{}"/></send>
    <send type="myapp:router" target="execution" event="e"><param name="document" expr="w"/></send>
    <send type="myapp:router" target="execution" event="e" namelist="document"/>
    <send type="myapp:router" target="execution" event="e"><param name="key" expr="'k'"/></send>
    <send type="myapp:router" target="execution" event="parcel.lost">
      <param name="document" expr="'parcel'"/></send>
    <send type="myapp:router" target="execution" event="parcel.returned" delay="2s">
      <param name="document" expr="'parcel'"/></send>
    <send type="myapp:router" target="execution" event="anything">
      <param name="document" expr="'nobody'"/></send>
    <send type="myapp:router" target="execution" event="parcel.lost">
      <param name="document" expr="'catalogue'"/></send>
  </transition>
</state>
</scxml>"""
"""One send per reason; each comment-free line keeps the locations below exact."""


def compiled(source: str) -> Machine:
    return compile_chart(source)


class Unrouted:
    def deliver(self, *_: object) -> Refused:
        return Refused("never handed anything")


def config(
    bindings: list[Binding] | None = None, routes: tuple[str, ...] = (), **options: Any
) -> RouterConfig:
    """A configuration with the router's type, over an in-memory SQLite adapter (never
    opened) and a resolver of the parcel chart."""
    options.setdefault("send_type", ROUTER)
    if "bindings_resolver" not in options:
        options["bindings"] = bindings or []
    return RouterConfig(
        SqlAdapter("sqlite://"),
        resolver=StaticResolver({"parcel": compiled(PARCEL)}),
        routes={name: RouteEntry(Unrouted()) for name in routes},
        **options,
    )


def at(line: int, column: int) -> dict[str, int]:
    return {"line": line, "column": column}


def test_every_reason_is_reported_at_its_send() -> None:
    catalogue = compiled('<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"/></scxml>')
    report = check(
        config(routes=("doorstep_photos",), timer_queue=None),
        "depot",
        compiled(EVERYTHING),
        {"parcel": ["parcel.scanned", "parcel.delivered", "parcel.returned"]},
        {"catalogue": catalogue},
    )
    sender = {"document": "depot"}
    assert report.as_json() == {
        "unsupported_types": [
            {
                "event": "courier.called",
                **sender,
                "reason": "unsupported_type",
                "location": at(5, 5),
                "type": "myapp:courier",
            }
        ],
        "unregistered_routes": [
            {
                "event": "photo.lost",
                **sender,
                "reason": "unregistered",
                "location": at(11, 8),
                "route": "nowhere",
            },
            {
                "event": "no.target",
                **sender,
                "reason": "unregistered",
                "location": at(13, 7),
                "route": None,
            },
            {
                "event": "photo.taken",
                **sender,
                "reason": "no_timer_queue",
                "location": at(15, 5),
                "route": "doorstep_photos",
            },
        ],
        "unchecked": [
            {"event": "x", **sender, "reason": "typeexpr", "location": at(6, 9)},
            {"event": "y", **sender, "reason": "targetexpr", "location": at(9, 5)},
            {"event": "photo.later", **sender, "reason": "delayexpr", "location": at(16, 5)},
            {"event": None, **sender, "reason": "eventexpr", "location": at(21, 7)},
            {"event": None, **sender, "reason": "no_event", "location": at(25, 5)},
            {"event": "e", **sender, "reason": "document_expr", "location": at(26, 5)},
            {"event": "e", **sender, "reason": "document_expr", "location": at(27, 5)},
            {"event": "e", **sender, "reason": "no_document", "location": at(28, 5)},
        ],
        "undeclared_events": [
            {
                "event": "parcel.lost",
                "document": "parcel",
                "reason": "undeclared",
                "location": at(29, 5),
            },
            {
                "event": "parcel.returned",
                "document": "parcel",
                "reason": "delay",
                "location": at(31, 5),
            },
            {
                "event": "anything",
                "document": "nobody",
                "reason": "not_published",
                "location": at(33, 5),
            },
            {
                "event": "parcel.lost",
                "document": "catalogue",
                "reason": "undeclared_by_computed_set",
                "location": at(35, 5),
            },
        ],
        "undeclared_binding_events": [],
    }
    assert not report.clean


def test_a_receiver_the_declarations_leave_out_is_judged_by_its_chart() -> None:
    depot, parcel = compiled(DEPOT), compiled(PARCEL)
    # The corpus's fallback case: parcel declares nothing; its chart takes the name.
    assert check(config(), "depot", depot, {}, {"parcel": parcel}).clean
    assert check(config(), "depot", depot, {"parcel": None}, {"parcel": parcel}).clean
    # Declared, the declaration is the contract, even where the chart would take it.
    declared = check(config(), "depot", depot, {"parcel": ["parcel.scanned"]}, {"parcel": parcel})
    assert [(f.reason, f.location) for f in declared.undeclared_events] == [
        ("undeclared", Location(4, 7))
    ]
    # [] is a declaration that accepts nothing.
    empty = check(config(), "depot", depot, {"parcel": []}, {"parcel": parcel})
    assert [f.reason for f in empty.undeclared_events] == ["undeclared"]
    # A chart that never takes the name.
    other = compiled(PARCEL.replace("parcel.returned", "parcel.refused"))
    computed = check(config(), "depot", depot, {}, {"parcel": other})
    assert computed.undeclared_events == (
        Finding(
            reason="undeclared_by_computed_set",
            event="parcel.returned",
            document="parcel",
            location=Location(4, 7),
        ),
    )


def test_a_document_with_no_chart_is_not_published() -> None:
    report = check(config(), "depot", compiled(DEPOT), {})
    assert [(f.reason, f.document) for f in report.undeclared_events] == [
        ("not_published", "parcel")
    ]
    # Declared as declaring nothing, and no chart: still not published.
    report = check(config(), "depot", compiled(DEPOT), {"parcel": None})
    assert [f.reason for f in report.undeclared_events] == ["not_published"]


def test_a_send_to_its_own_document_is_judged_by_the_chart_being_published() -> None:
    own = DEPOT.replace("'parcel'", "'depot'")
    assert [f.reason for f in check(config(), "depot", compiled(own), {}).undeclared_events] == [
        "undeclared_by_computed_set"
    ]
    takes = own.replace('event="courier.nobody_home"', 'event="courier.* parcel.returned"')
    assert check(config(), "depot", compiled(takes), {}).clean


def test_the_computed_set_counts_only_states_that_can_be_active() -> None:
    chart = compiled(
        """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="p">
  <parallel id="p">
    <state id="left"><transition event="left.*" target="away"/></state>
    <state id="right">
      <state id="r1"><transition event="r1.go" target="r2"/></state>
      <state id="r2"/>
      <history id="h"><transition target="r1"/></history>
    </state>
  </parallel>
  <state id="away"><transition event="back" target="h"/></state>
  <state id="island"><transition event="never.seen" target="away"/></state>
</scxml>"""
    )
    assert [accepts(chart, name) for name in ("left.x.y", "left", "r1.go", "back")] == [True] * 4
    assert not accepts(chart, "never.seen")  # no transition ever enters `island`
    assert not accepts(chart, "r1")  # a descriptor matches its own tokens and longer names
    wildcard = compiled(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml">'
        '<state id="s"><transition event="*"/></state></scxml>'
    )
    assert accepts(wildcard, "anything.at.all")


def test_delay_to_an_execution_target_is_a_finding_whatever_the_event() -> None:
    delayed = DEPOT.replace('event="parcel.returned"', 'event="parcel.returned" delay="1s"')
    declared = {"parcel": ["parcel.returned"]}
    report = check(config(), "depot", compiled(delayed), declared)
    assert report.undeclared_events == (
        Finding(
            reason="delay", event="parcel.returned", document="parcel", location=Location(4, 7)
        ),
    )
    by_expr = DEPOT.replace('event="parcel.returned"', 'event="parcel.returned" delayexpr="\'1s\'"')
    assert [
        f.reason for f in check(config(), "depot", compiled(by_expr), declared).undeclared_events
    ] == ["delay"]
    no_wait = DEPOT.replace('event="parcel.returned"', 'event="parcel.returned" delay="0s"')
    assert check(config(), "depot", compiled(no_wait), declared).clean


def test_no_timer_queue_is_reported_only_without_a_queue() -> None:
    chart = compiled(
        """<scxml xmlns="http://www.w3.org/2005/07/scxml">
  <state id="s">
    <onentry>
      <send type="myapp:router" target="doorstep_photos" delay="30s" event="photo.taken"/>
    </onentry>
  </state>
</scxml>"""
    )
    without = check(config(routes=("doorstep_photos",), timer_queue=None), "c", chart, {})
    assert [f.as_json() for f in without.unregistered_routes] == [
        {
            "event": "photo.taken",
            "document": "c",
            "reason": "no_timer_queue",
            "location": at(4, 7),
            "route": "doorstep_photos",
        }
    ]
    assert check(config(routes=("doorstep_photos",)), "c", chart, {}).clean  # built-in queue
    # Unregistered wins: the route is never reached, queue or not.
    unregistered = check(config(timer_queue=None), "c", chart, {})
    assert [f.reason for f in unregistered.unregistered_routes] == ["unregistered"]


def test_host_schemes_never_reach_a_route() -> None:
    chart = compiled(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"><onentry>\n'
        '<send type="myapp:router" target="kafka:topic" event="e"/></onentry></state></scxml>'
    )
    report = check(config(routes=("kafka:topic",)), "c", chart, {})
    assert [(f.reason, f.route, f.location) for f in report.unregistered_routes] == [
        ("unregistered", "kafka:topic", Location(2, 1))
    ]


def test_supported_send_types() -> None:
    chart = compiled(
        """<scxml xmlns="http://www.w3.org/2005/07/scxml">
  <state id="s">
    <onentry>
      <send event="a"/>
      <send type="scxml" event="b"/>
      <send type="http://www.w3.org/TR/scxml/#SCXMLEventProcessor" event="c"/>
      <send type="basichttp" target="https://example.com/hook" event="d"/>
      <send type="http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor" target="h" event="e"/>
      <send type="myapp:courier" event="f"/>
      <send type="myapp:router" target="execution" event="g">
        <param name="document" expr="'parcel'"/>
      </send>
    </onentry>
  </state>
</scxml>"""
    )
    courier = StartOptions(send_types=frozenset({"myapp:courier"}))
    assert check(config(start_options=courier), "s", chart, {"parcel": ["g"]}).clean
    report = check(config(), "s", chart, {"parcel": ["g"]})
    assert [(f.type, f.location) for f in report.unsupported_types] == [
        ("myapp:courier", Location(9, 7))
    ]
    # With no send type the router claims no send: its type is unsupported, and
    # nothing is routed or judged.
    plain = check(config(send_type=None), "s", chart, {})
    assert [f.type for f in plain.unsupported_types] == ["myapp:courier", "myapp:router"]
    assert plain.unregistered_routes == plain.undeclared_events == ()


def test_undeclared_binding_events() -> None:
    def binding(name: str, document: str, event: str, enabled: bool = True) -> Binding:
        return Binding(
            id=name,
            source="depot_feed",
            match="true",
            key="event.parcel_id",
            document=document,
            event=event,
            enabled=enabled,
        )

    bindings = [
        binding("scans", "parcel", "parcel.scanned"),
        binding("depot_lost", "parcel", "parcel.lost"),
        binding("off", "parcel", "parcel.lost", enabled=False),
        binding("to_depot", "depot", "courier.nobody_home"),
        binding("to_depot_wrong", "depot", "courier.home"),
        binding("to_nobody", "nobody", "x"),
    ]
    declared = {"parcel": ["parcel.scanned", "parcel.delivered"]}
    report = check(config(bindings), "depot", compiled(DEPOT), declared)
    assert [f.as_json() for f in report.undeclared_binding_events] == [
        {
            "event": "parcel.lost",
            "document": "parcel",
            "reason": "undeclared",
            "binding_id": "depot_lost",
        },
        {
            "event": "courier.home",
            "document": "depot",
            "reason": "undeclared_by_computed_set",
            "binding_id": "to_depot_wrong",
        },
        {"event": "x", "document": "nobody", "reason": "not_published", "binding_id": "to_nobody"},
    ]
    # The same, for one scope's bindings.
    alone = binding_events(bindings, declared, {"depot": compiled(DEPOT)})
    assert alone == report.undeclared_binding_events


def test_a_bindings_resolver_leaves_the_bindings_unchecked() -> None:
    typed = DEPOT.replace('target="execution"', "targetexpr=\"'execution'\"")
    report = check(
        config(bindings_resolver=lambda scope: []), "depot", compiled(typed), {"parcel": []}
    )
    assert report.unchecked == (
        Finding(reason="bindings_resolver"),
        Finding(
            reason="targetexpr", event="parcel.returned", document="depot", location=Location(4, 7)
        ),
    )
    assert report.as_json()["unchecked"][0] == {
        "event": None,
        "document": None,
        "reason": "bindings_resolver",
        "location": None,
    }
    assert report.undeclared_binding_events == ()
    assert check(config(), "depot", compiled(DEPOT), {}, {"parcel": compiled(PARCEL)}).clean


def test_a_declaration_is_a_list_of_names() -> None:
    # A string is a sequence of strings to the type checker, never a declaration here.
    with pytest.raises(TypeError, match="'parcel' must be a list"):
        check(config(), "depot", compiled(DEPOT), {"parcel": "parcel.returned"})


def test_report_shape_and_lines() -> None:
    assert Contracts().clean
    assert list(Contracts().as_json()) == [
        "unsupported_types",
        "unregistered_routes",
        "unchecked",
        "undeclared_events",
        "undeclared_binding_events",
    ]
    finding = Finding(
        reason="undeclared", event="parcel.lost", document="parcel", location=Location(3, 9)
    )
    assert finding.format("depot.scxml") == "depot.scxml:3:9: undeclared: parcel.lost (parcel)"
    bound = Finding(reason="not_published", event="x", document="d", binding_id="b")
    assert bound.format("bindings.toml") == "bindings.toml: not_published: x (d) [binding b]"


# statifier check


def write_project(tmp_path: Path, config_text: str, name: str = "check.toml") -> Path:
    charts = tmp_path / "charts"
    charts.mkdir(exist_ok=True)
    (charts / "depot.scxml").write_text(DEPOT, encoding="utf-8")
    (charts / "parcel.scxml").write_text(PARCEL, encoding="utf-8")
    path = tmp_path / name
    path.write_text(config_text, encoding="utf-8")
    return path


CHECK_TOML = """document = "depot"
charts = "charts"
send_type = "myapp:router"
bindings = "bindings.toml"

[declarations]
parcel = ["parcel.scanned", "parcel.delivered"]
"""

BINDINGS_TOML = """[[bindings]]
id = "depot_lost"
source = "depot_feed"
match = "event.kind == 'lost'"
key = "event.parcel_id"
document = "parcel"
event = "parcel.lost"
"""


def run_check(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = cli.main(["check", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_cli_prints_findings_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_project(tmp_path, CHECK_TOML)
    (tmp_path / "bindings.toml").write_text(BINDINGS_TOML, encoding="utf-8")
    status, out, err = run_check(capsys, path)
    assert (status, err) == (1, "")
    assert out.splitlines() == [
        f"{tmp_path / 'charts' / 'depot.scxml'}:4:7: undeclared: parcel.returned (parcel)",
        f"{tmp_path / 'bindings.toml'}: undeclared: parcel.lost (parcel) [binding depot_lost]",
    ]
    status, out, _ = run_check(capsys, path, "--json")
    assert status == 1
    contracts = json.loads(out)["contracts"]
    assert contracts["undeclared_events"] == [
        {
            "event": "parcel.returned",
            "document": "parcel",
            "reason": "undeclared",
            "location": {"line": 4, "column": 7},
        }
    ]
    assert [f["binding_id"] for f in contracts["undeclared_binding_events"]] == ["depot_lost"]


def test_cli_clean_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # JSON input; the left-out parcel is judged by charts/parcel.scxml.
    text = json.dumps({"document": "depot", "charts": "charts", "send_type": ROUTER})
    path = write_project(tmp_path, text, "check.json")
    status, out, err = run_check(capsys, path)
    assert (status, out, err) == (0, f"{tmp_path / 'charts' / 'depot.scxml'}: ok\n", "")
    # --charts wins over the file's key (relative to the working directory).
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "depot.scxml").write_text(DEPOT, encoding="utf-8")
    status, out, _ = run_check(capsys, path, "--charts", other)
    assert status == 1  # no parcel chart there: not published
    assert out.endswith(": not_published: parcel.returned (parcel)\n")


def test_cli_routes_and_timer_queue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    photos = DEPOT.replace(
        "</transition>",
        '  <send type="myapp:router" target="photos" delay="1m" event="photo.taken"/>\n'
        "    </transition>",
    )
    text = CHECK_TOML.replace('bindings = "bindings.toml"\n', 'routes = ["photos"]\n')
    text = text.replace("[declarations]", "timer_queue = false\n\n[declarations]")
    text = text.replace('"parcel.delivered"]', '"parcel.delivered", "parcel.returned"]')
    path = write_project(tmp_path, text)
    (tmp_path / "charts" / "depot.scxml").write_text(photos, encoding="utf-8")
    status, out, _ = run_check(capsys, path)
    assert status == 1
    chart = tmp_path / "charts" / "depot.scxml"
    assert out.splitlines() == [f"{chart}:8:7: no_timer_queue: photo.taken (depot) [route photos]"]


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        ("document = \n", "check.toml: not valid TOML: "),
        ('document = "depot"\ncharts = "charts"\nqueue = 1\n', "check.toml: unknown key 'queue'"),
        ('charts = "charts"\n', "check.toml: key 'document' is required"),
        ('document = "depot"\n', "check.toml: key 'charts': give the chart directory"),
        ('document = "ghost"\ncharts = "charts"\n', "check.toml: key 'document': no chart "),
        (
            'document = "depot"\ncharts = "charts"\nroutes = "photos"\n',
            "check.toml: key 'routes': must be a list of at most 10000 non-empty strings",
        ),
        (
            'document = "depot"\ncharts = "charts"\ntimer_queue = "yes"\n',
            "check.toml: key 'timer_queue': must be true or false",
        ),
        (
            'document = "depot"\ncharts = "charts"\n[declarations]\nparcel = "parcel.lost"\n',
            "check.toml: key 'declarations': key 'parcel': must be a list",
        ),
        (
            'document = "depot"\ncharts = "charts"\n[[bindings]]\nid = "b"\n',
            "check.toml: key 'bindings': binding 'b', field 'source': required",
        ),
        (
            (
                'document = "depot"\ncharts = "charts"\n[[bindings]]\nid = "b"\nsource = "s"\n'
                'match = "true"\nkey = "event.k"\ndocument = "depot"\nevent = "e"\n'
                'mode = "debounce"\nwindow = "P1W"\n'
            ),
            "check.toml: key 'bindings': binding 'b', field 'window': 'P1W' is not a duration",
        ),
        (
            'document = "depot"\ncharts = "charts"\nbindings = "missing.toml"\n',
            "missing.toml: cannot read: No such file or directory",
        ),
        (
            'document = "depot"\ncharts = "charts"\nroutes = ["photos"]\n',
            "check.toml: routes need a send_type",
        ),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config_text: str, message: str
) -> None:
    path = write_project(tmp_path, config_text)
    status, out, err = run_check(capsys, path)
    assert (status, out) == (2, "")
    assert err.startswith("statifier check: ")
    assert err.count("\n") == 1
    assert message in err


def test_cli_bounds_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_project(tmp_path, "#" * ((1 << 20) + 1))
    status, _, err = run_check(capsys, path)
    assert status == 2
    assert err == f"statifier check: {path}: larger than {1 << 20} bytes\n"
    broken = write_project(tmp_path, CHECK_TOML.replace('bindings = "bindings.toml"\n', ""))
    (tmp_path / "charts" / "parcel.scxml").write_text("<scxml", encoding="utf-8")
    status, _, err = run_check(capsys, broken)
    assert status == 2
    assert err.startswith(f"statifier check: {tmp_path / 'charts' / 'parcel.scxml'}:1:")
