"""The controller app's handlers driven by fake switches (no event loop, no Open vSwitch):
what each switch's session goes through from connecting to programmed, on a failure, and
across a disconnection and a reconnection."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

from controllers.app import ControllerSettings, FabricController
from controllers.policies import default_registry
from controllers.routing import programmable_switches
from controllers.status import read_status
from tests.helpers import preset_description
from topologies.model import Link, LinkKind

DESCRIPTION = preset_description("astral-small")


class FakeDatapath:
    """What the app uses of os-ken's Datapath: it numbers and records what is sent."""

    def __init__(self, dpid: int) -> None:
        self.id = dpid
        self.ofproto, self.ofproto_parser = ofproto_v1_3, ofproto_v1_3_parser
        self.address = ("127.0.0.1", 40000 + dpid)
        self.sent: list[Any] = []
        self._xid = 0

    def send_msg(self, msg: Any) -> None:
        if msg.xid is None:
            self._xid += 1
            msg.set_xid(self._xid)
        self.sent.append(msg)

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.sent]

    def barriers(self) -> list[int]:
        return [m.xid for m in self.sent if isinstance(m, ofproto_v1_3_parser.OFPBarrierRequest)]


def controller(tmp_path: Path) -> FabricController:
    policy = default_registry().create("shortest")
    settings = ControllerSettings(
        DESCRIPTION, policy, "127.0.0.1", 6653, status_path=tmp_path / "status.json"
    )
    return FabricController(astral_settings=settings)


def connect(app: FabricController, dp: FakeDatapath, down: tuple[int, ...] = ()) -> None:
    features(app, dp)
    read(app, dp, down)


def features(app: FabricController, dp: FakeDatapath) -> None:
    app.switch_features(SimpleNamespace(msg=SimpleNamespace(datapath=dp, datapath_id=dp.id)))


def read(app: FabricController, dp: FakeDatapath, down: tuple[int, ...] = ()) -> None:
    """The replies a switch sends after connecting: ports (``down`` down), empty tables."""
    request = next(m for m in dp.sent if isinstance(m, ofproto_v1_3_parser.OFPFlowStatsRequest))
    ports = [port(p, p in down) for p in range(1, 9)]
    app.port_desc_reply(SimpleNamespace(msg=SimpleNamespace(datapath=dp, body=ports, flags=0)))
    app.group_desc_reply(SimpleNamespace(msg=SimpleNamespace(datapath=dp, body=[], flags=0)))
    reply = SimpleNamespace(datapath=dp, xid=request.xid, body=[], flags=0)
    app.flow_stats_reply(SimpleNamespace(msg=reply))


def port(number: int, down: bool) -> SimpleNamespace:
    return SimpleNamespace(
        port_no=number, state=ofproto_v1_3.OFPPS_LINK_DOWN if down else 0, config=0
    )


def port_status(app: FabricController, dp: FakeDatapath, number: int, down: bool) -> None:
    msg = SimpleNamespace(datapath=dp, desc=port(number, down), reason=ofproto_v1_3.OFPPR_MODIFY)
    app.port_status(SimpleNamespace(msg=msg))


def answer(app: FabricController, dp: FakeDatapath, xid: int) -> None:
    app.barrier_reply(SimpleNamespace(msg=SimpleNamespace(datapath=dp, xid=xid)))


def programmed(tmp_path: Path, dpid: int) -> bool:
    status = read_status(tmp_path / "status.json")
    assert status is not None
    return status.switches[dpid].programmed


def test_a_switch_is_read_then_programmed_then_confirmed_by_its_barrier(tmp_path: Path) -> None:
    app = controller(tmp_path)
    switch = programmable_switches(DESCRIPTION.fabric)[0]
    dp = FakeDatapath(switch.dpid)
    features(app, dp)
    # Table-miss and ARP entries, then the flow and group tables are asked for.
    assert dp.kinds() == [
        "OFPFlowMod",
        "OFPFlowMod",
        "OFPFlowStatsRequest",
        "OFPGroupDescStatsRequest",
    ]
    session = app.sessions[switch.dpid]
    assert session.connecting is not None
    assert not session.ready
    asked = len(dp.sent)
    read(app, dp)
    flows = app.plan.tables[switch.dpid].flows
    assert dp.kinds()[asked:] == ["OFPFlowMod"] * len(flows) + ["OFPBarrierRequest"]
    assert session.connecting is None
    assert session.ready
    assert session.installed == {e.key: e for e in flows}
    assert not programmed(tmp_path, switch.dpid)
    answer(app, dp, dp.barriers()[-1])
    assert programmed(tmp_path, switch.dpid)


def test_a_failure_reprograms_and_only_the_latest_barrier_counts(tmp_path: Path) -> None:
    app = controller(tmp_path)
    switches = programmable_switches(DESCRIPTION.fabric)
    dps = {s.dpid: FakeDatapath(s.dpid) for s in switches}
    for dp in dps.values():
        connect(app, dp)
        answer(app, dp, dp.barriers()[-1])
    link = DESCRIPTION.fabric.links_of_kind(LinkKind.TOR_AGG)[0]
    tor = DESCRIPTION.fabric.switches[link.a]
    dp = dps[tor.dpid]
    port_status(app, dp, link.a_port, down=True)
    assert app.failed == frozenset({link})
    assert app.sessions[tor.dpid].down == {link.a_port}
    first = dp.barriers()[-1]
    port_status(app, dp, link.a_port, down=False)
    assert app.failed == frozenset()
    latest = dp.barriers()[-1]
    assert latest != first
    answer(app, dp, first)
    assert not programmed(tmp_path, tor.dpid), "a barrier sent before the latest push"
    answer(app, dp, latest)
    assert programmed(tmp_path, tor.dpid)


def test_ports_down_outlive_a_disconnection_and_a_reconnection_reads_the_switch_again(
    tmp_path: Path,
) -> None:
    app = controller(tmp_path)
    switches = programmable_switches(DESCRIPTION.fabric)
    dps = {s.dpid: FakeDatapath(s.dpid) for s in switches}
    link: Link = DESCRIPTION.fabric.links_of_kind(LinkKind.TOR_AGG)[0]
    tor = DESCRIPTION.fabric.switches[link.a]
    for dp in dps.values():
        connect(app, dp, down=(link.a_port,) if dp.id == tor.dpid else ())
        answer(app, dp, dp.barriers()[-1])
    assert app.failed == frozenset({link})
    old = dps[tor.dpid]
    app.switch_gone(SimpleNamespace(datapath=old))
    session = app.sessions[tor.dpid]
    assert session.datapath is None
    assert not session.ready
    assert session.installed == {}
    # A switch that disconnects is neither a failure nor a repair: its last ports hold.
    assert session.down == {link.a_port}
    assert app.failed == frozenset({link})
    assert not programmed(tmp_path, tor.dpid)

    new = FakeDatapath(tor.dpid)
    connect(app, new)  # every port up now
    assert session.datapath is new
    assert session.down == set()
    assert app.failed == frozenset()
    assert session.installed == {e.key: e for e in app.plan.tables[tor.dpid].flows}
    answer(app, old, old.barriers()[-1])  # the old connection's: not the current one
    assert not programmed(tmp_path, tor.dpid)
    answer(app, new, new.barriers()[-1])
    assert programmed(tmp_path, tor.dpid)
