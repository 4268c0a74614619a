"""What a launch is given: the ranks (where each runs, its addresses), the tests, the options.

Plain data, apart from :class:`~orchestrator.worker.launcher.Launcher` that acts on it, so
that a caller can describe a run (from a fabric description or on loopback) without the
process machinery.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.collectives.latency import LatencyTable
from orchestrator.collectives.plans import ELEMENT_BYTES
from orchestrator.collectives.program import PROGRAM, Program

#: The port every worker listens on, in its own namespace (the destination port of every
#: connection: part of the five-tuple the switches hash and the forecast follows).
WORKER_PORT = 47000

if TYPE_CHECKING:
    from topologies.description import FabricDescription


@dataclass(frozen=True)
class WorkerSpec:
    """One rank: where it runs and its addresses. ``local_rank`` is its rail."""

    rank: int
    host: str
    server: str
    local_rank: int
    fabric_ip: str
    nvlink_ip: str


@dataclass(frozen=True)
class CollectiveTest:
    """One row of an nccl-tests table: a collective, its algorithm and a size in bytes.

    Or a program (orchestrator/collectives/program.py: collectives on groups of ranks,
    transfers and compute, as one operation): collective ``program``, the program's name
    as algorithm, its buffers' bytes as size (:meth:`of_program`); the workers compose
    their plans and expected results from it.
    """

    collective: str
    algorithm: str
    size: int
    program: Program | None = None

    def __post_init__(self) -> None:
        if (self.collective == PROGRAM) != (self.program is not None):
            raise ValueError(f"a test of collective {PROGRAM!r} needs a program, and only it")

    @classmethod
    def of_program(cls, program: Program) -> CollectiveTest:
        return cls(PROGRAM, program.name, program.elements() * ELEMENT_BYTES, program)

    @property
    def label(self) -> str:
        if self.program is not None:
            return f"program {self.program.name!r}"
        return f"{self.collective}/{self.algorithm} {self.size} B"


@dataclass(frozen=True)
class LaunchOptions:
    """How the ranks run: iterations, connections, socket buffers, pinned source ports, the
    latencies each step waits, and the timings of the launcher's failure detection."""

    warmup: int = 1
    iterations: int = 5
    #: the timed batch runs at least ``iterations`` operations and, judged by the warm-up's
    #: time per operation, long enough to last this many seconds (0: exactly
    #: ``iterations``). The testbed sets it so that the shapers' token buckets can add at
    #: most a small share to a batch (orchestrator.collectives.ceilings.min_batch_seconds).
    min_batch_seconds: float = 0.0
    #: ... but never more operations than this
    max_iterations: int = 1000
    #: the timed operations in batches of this many, each after a barrier (0: one batch).
    #: A training iteration's replay times each alone (1): back to back, a rank that ends
    #: early starts the next one early and its waiting lands in the next one's timeline
    timed_batch: int = 0
    channels: int = 1  # connections per ordered peer pair
    verify: bool = True
    socket_buffer: int = 0  # SO_SNDBUF/SO_RCVBUF; 0 keeps the kernel's autotuning
    # (src rank, dst rank, channel) -> source port of that connection (path pinning)
    source_ports: Mapping[tuple[int, int, int], int] = field(default_factory=dict)
    # emulated per-step latencies (orchestrator.collectives.latency); None: the testbed
    # fills in its fabric's, and a launch without a fabric (loopback) adds none
    latency: LatencyTable | None = None
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 3.0
    step_deadline: float = 30.0
    setup_timeout: float = 30.0  # start-up to hello, and connection set-up
    settle_time: float = 0.5  # evidence gathering before blaming a rank
    exit_timeout: float = 3.0
    sample_interval: float = 0.01
    #: the senders' TCP_INFO (RTT, cwnd, retransmissions) with their throughput samples,
    #: at most every ``tcp_info_interval`` seconds per connection (the monitor's full
    #: detail, orchestrator.testbed.monitoring)
    tcp_info: bool = False
    tcp_info_interval: float = 0.05
    python: str = sys.executable
    worker_args: tuple[str, ...] = ()  # extra argv for every worker (fault injection)


def loopback_workers(ranks: int, gpus_per_server: int = 1) -> list[WorkerSpec]:
    """Ranks on loopback addresses: fabric 127.0.1.(r+1), NVLink 127.0.2.(r+1); rank r on
    server r // gpus_per_server with local rank (rail) r % gpus_per_server."""
    if not 1 <= ranks <= 254:
        raise ValueError("loopback_workers: 1 to 254 ranks")
    return [
        WorkerSpec(
            rank=r,
            host=f"lo{r}",
            server=f"s{r // gpus_per_server}",
            local_rank=r % gpus_per_server,
            fabric_ip=f"127.0.1.{r + 1}",
            nvlink_ip=f"127.0.2.{r + 1}",
        )
        for r in range(ranks)
    ]


def workers_from_description(
    description: FabricDescription, gpus: Sequence[str] | None = None
) -> list[WorkerSpec]:
    """Rank i plays ``gpus[i]`` (default: every GPU in rank order), at the addresses of the
    fabric description's plan (fabric address, NVLink address)."""
    fabric = description.fabric
    names = list(gpus) if gpus is not None else [g.name for g in fabric.gpus_by_rank()]
    workers = []
    for rank, name in enumerate(names):
        gpu, addresses = fabric.gpus[name], description.addresses[name]
        workers.append(
            WorkerSpec(
                rank=rank,
                host=name,
                server=gpu.server,
                local_rank=gpu.local_rank,
                fabric_ip=addresses.fabric_ip,
                nvlink_ip=addresses.nvlink.ip,
            )
        )
    return workers
