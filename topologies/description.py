"""The generated fabric description: one JSON file the orchestrator writes per run.

It carries everything computed from the user's fabric file (switches with datapath ids,
links with real and emulated rates, the addressing plan), so that the controller process
and the workers read it instead of deriving anything themselves. Format (version 1)::

    {"version": 1,
     "spec": {...FabricSpec.to_dict()...},
     "gpu_forwarding": false,
     "gateway": {"ip": "10.255.255.254", "mac": "02:a5:ff:ff:ff:fe"},
     "switches": [{"name", "tier", "dpid", "pod", "rail", "index"}, ...],
     "servers": [{"name", "pod", "index", "gpus": [...], "nvswitch"}, ...],
     "gpus": [{"name", "rank", "pod", "server", "local_rank"}, ...],
     "links": [{"a", "a_port", "b", "b_port", "kind", "capacity", "emulated"}, ...],
     "addresses": {"<gpu>": {...GpuAddresses...}, ...},
     "latency": {...latency_record(fabric)...},   # the one-way latencies applied, per
                               # kind of path, real and emulated (topologies/latency.py)
     "extra": {...}}           # free-form, for the orchestrator (controller port, policy)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from topologies.addressing import GATEWAY_IP, GATEWAY_MAC, GpuAddresses, PortAddress, address_plan
from topologies.latency import latency_record
from topologies.model import Fabric, Gpu, Link, LinkKind, Server, Switch, Tier
from topologies.spec import parse_fabric_spec

VERSION = 1


@dataclass
class FabricDescription:
    fabric: Fabric
    addresses: dict[str, GpuAddresses]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, fabric: Fabric, **extra: Any) -> FabricDescription:
        return cls(fabric, address_plan(fabric), dict(extra))

    def emulated_rate(self, link: Link) -> float:
        return self.fabric.spec.emulation.emulated(link.capacity)

    def to_dict(self) -> dict[str, Any]:
        fabric = self.fabric
        return {
            "version": VERSION,
            "spec": fabric.spec.to_dict(),
            "gpu_forwarding": fabric.gpu_forwarding,
            "gateway": {"ip": GATEWAY_IP, "mac": GATEWAY_MAC},
            "switches": [
                {**asdict(s), "tier": s.tier.value}
                for s in sorted(fabric.switches.values(), key=lambda s: s.dpid)
            ],
            "servers": [asdict(s) for s in fabric.servers.values()],
            "gpus": [asdict(g) for g in fabric.gpus_by_rank()],
            "links": [
                {**asdict(link), "kind": link.kind.value, "emulated": self.emulated_rate(link)}
                for link in fabric.links
            ],
            "addresses": {name: asdict(a) for name, a in self.addresses.items()},
            "latency": latency_record(fabric),
            "extra": self.extra,
        }

    def write(self, path: str | Path) -> Path:
        """Write atomically (readers never see half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fabric-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FabricDescription:
        if data.get("version") != VERSION:
            raise ValueError(f"unsupported fabric description version {data.get('version')!r}")
        spec = parse_fabric_spec(data["spec"], "<fabric description>")
        switches = {
            s["name"]: Switch(
                name=s["name"],
                tier=Tier(s["tier"]),
                dpid=s["dpid"],
                pod=s["pod"],
                rail=s["rail"],
                index=s["index"],
            )
            for s in data["switches"]
        }
        servers = {
            s["name"]: Server(s["name"], s["pod"], s["index"], tuple(s["gpus"]), s["nvswitch"])
            for s in data["servers"]
        }
        gpus = {g["name"]: Gpu(**g) for g in data["gpus"]}
        links = [
            Link(
                a=x["a"],
                a_port=x["a_port"],
                b=x["b"],
                b_port=x["b_port"],
                kind=LinkKind(x["kind"]),
                capacity=x["capacity"],
            )
            for x in data["links"]
        ]
        fabric = Fabric(spec, switches, gpus, servers, links, bool(data["gpu_forwarding"]))
        addresses = {
            name: GpuAddresses(
                **{
                    **a,
                    "nvlink": PortAddress(**a["nvlink"]),
                    "nics": tuple(PortAddress(**n) for n in a["nics"]),
                }
            )
            for name, a in data["addresses"].items()
        }
        return cls(fabric, addresses, dict(data.get("extra", {})))

    @classmethod
    def read(cls, path: str | Path) -> FabricDescription:
        with open(path, encoding="utf-8") as src:
            return cls.from_dict(json.load(src))
