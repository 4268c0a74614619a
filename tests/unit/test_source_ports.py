"""orchestrator.testbed.pinning.source_ports: which connections get a pinned source port,
and that every one that does not is counted (unpinned), over a fake ``ip route get``.

The kernel's answer is the one thing faked (:class:`RouteAnswers`, a CommandExecutor);
the paths file is the controller's own (``paths_document`` of astral-small).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controllers.pinning import PinnedPaths, paths_document, write_json
from orchestrator.emulation.executor import Completed
from orchestrator.testbed.pinning import fabric_flows, source_ports
from orchestrator.worker.spec import workers_from_description
from tests.helpers import preset_description


class RouteAnswers:
    """A CommandExecutor for ``ip -json -batch`` of ``route get``: the device is NIC 1 or 2
    by a hash of the source port (as the kernel's multipath hash picks one), or always NIC
    1 for the GPUs in ``stuck`` (so that a connection asking for NIC 2 there never finds a
    port)."""

    def __init__(self, stuck: set[str]) -> None:
        self.stuck = stuck

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        answers = []
        for line in str(options.get("input", "")).splitlines():
            sport = int(line.split(" sport ")[1].split()[0])
            port = 1 if node in self.stuck else zlib.crc32(b"%d" % sport) % 2 + 1
            answers.append(json.dumps([{"dev": f"{node}-eth{port}"}]))
        return Completed(tuple(argv), 0, "\n".join(answers) + "\n", "")

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> Any:
        raise AssertionError("pinning starts no process")


def test_connections_without_a_port_or_without_a_path_are_counted_unpinned(
    tmp_path: Path,
) -> None:
    description = preset_description("astral-small")
    document = paths_document(PinnedPaths(description))
    # the controller published no path for one pair: its flows cannot be pinned either
    document["pairs"] = [
        p for p in document["pairs"] if (p["src"], p["dst"]) != ("p0s0g1", "p0s1g1")
    ]
    write_json(tmp_path / "paths.json", document)
    workers = workers_from_description(description)
    pinning = source_ports(
        RouteAnswers(stuck={"p1s1g1"}),
        description,
        workers,
        2,
        47000,
        [("all-to-all", "direct")],
        host_ports="balanced",
        paths=json.loads((tmp_path / "paths.json").read_text()),
    )
    flows = fabric_flows(workers, [("all-to-all", "direct")], 2)[0]
    assert pinning.flows == len(flows) == 8 * 6 * 2
    assert set(pinning.ports) | set(pinning.unpinned) == set(flows)
    rank = {w.host: w.rank for w in workers}
    no_path = {(rank["p0s0g1"], rank["p0s1g1"], c) for c in (0, 1)}
    assert no_path <= set(pinning.unpinned)  # never chosen, still counted
    stuck = {f for f in pinning.chosen if f[0] == rank["p1s1g1"] and pinning.chosen[f].nic == 2}
    assert stuck and stuck <= set(pinning.unpinned)
    assert set(pinning.unpinned) == no_path | stuck
