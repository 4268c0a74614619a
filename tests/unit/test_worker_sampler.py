"""orchestrator.worker.transport.Sampler: what it emits per tick, on a connection whose
kernel counters the test sets (the emission rules, not the kernel's TCP)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.worker.transport import HANDSHAKE_SENT, Sampler, TcpView


@dataclass
class Scripted:
    """A sending end whose kernel count and view the test moves by hand."""

    index: int = 0
    busy: bool = True
    outgoing: bool = True
    sent: int = 0
    value: int = HANDSHAKE_SENT
    retrans: int = 0

    def kernel_view(self) -> tuple[int, TcpView]:
        return self.value, TcpView(9_000, 1_000, 10, 20, self.retrans, 0, 4 if self.busy else 0)


@dataclass
class Pool:
    order: list[Any] = field(default_factory=list)


def settle(sampler: Sampler) -> None:
    """The handshake's bytes counted and bracketed, then forgotten."""
    sampler.tick()
    sampler.tick()
    sampler.drain()


def test_a_stalled_connection_keeps_sending_its_kernel_views() -> None:
    """Moving, then stalled with work queued (a hole: it retransmits, nothing is
    acknowledged), then moving again: the stall carries zero-byte samples with the
    kernel's views (its retransmissions rising), and the burst after it is bracketed
    once."""
    conn = Scripted()
    pool: Any = Pool([conn])  # the Sampler reads only its order
    sampler = Sampler(pool, tcp_info=1e-9)  # a view at every tick
    settle(sampler)
    for _ in range(3):
        conn.value += 6_000
        sampler.tick()
    for _ in range(4):  # stalled: nothing acknowledged, retransmitting into the hole
        conn.retrans += 1
        sampler.tick()
    conn.value += 6_000
    sampler.tick()
    samples = sampler.drain()
    moved = [s.bytes for s in samples]
    assert moved == [0, 6_000, 6_000, 6_000, 0, 0, 0, 0, 6_000]
    assert [s.view.retrans for s in samples[4:8] if s.view] == [1, 2, 3, 4]
    times = [s.t for s in samples]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_an_idle_connection_costs_nothing() -> None:
    """No work queued and nothing moving: no sample, view or not."""
    conn = Scripted(busy=False)
    pool: Any = Pool([conn])
    sampler = Sampler(pool, tcp_info=1e-9)
    settle(sampler)
    for _ in range(3):
        sampler.tick()
    assert sampler.drain() == []
