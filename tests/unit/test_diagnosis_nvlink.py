"""Down NVLink links and switches from the connections between GPUs of one server
(orchestrator/diagnosis/nvlink.py), on recorded-like samples: who could not send at all,
who lost what it sent, and a stall that only followed the network's."""

from __future__ import annotations

from orchestrator.diagnosis.nvlink import NvlinkView, down_faults, longest_stall

SW = "p0s0nv"
T0 = 1000.0


def view(
    cid: int, src: str, dst: str, moved_until: float, stalled_for: float, in_flight: int
) -> NvlinkView:
    """A connection that moved bytes every 50 ms until ``moved_until`` (s after T0), then
    sampled zero bytes every 50 ms for ``stalled_for`` s with ``in_flight`` segments
    unacknowledged meanwhile."""
    v = NvlinkView(cid, 1, src, dst, SW, 90e6)
    t = T0
    while t < T0 + moved_until:
        v.samples.append((t, 4000))
        v.unacked.append((t, 2))
        t += 0.05
    end = t + stalled_for
    while t <= end:
        v.samples.append((t, 0))
        v.unacked.append((t, in_flight))
        t += 0.05
    v.samples.append((t, 4000))  # the stall ends
    return v


def found(views: list[NvlinkView], fabric_first: dict[int, float] | None = None) -> list[tuple]:
    return [(s.component, s.target, s.fault) for s in down_faults(views, fabric_first or {})]


def test_two_gpus_that_cannot_send_are_the_switch() -> None:
    views = [view(1, "g0", "g1", 0.0, 30.0, 0), view(2, "g1", "g2", 0.0, 30.0, 0)]
    assert found(views)[0] == ("switch", SW, "down")


def test_one_gpu_that_cannot_send_and_one_that_lost_towards_it_is_its_link() -> None:
    # g1's link down: g0 sends into the switch and loses it; g1 cannot send at all
    views = [view(1, "g0", "g1", 1.0, 5.0, 3), view(2, "g1", "g2", 1.0, 5.0, 0)]
    assert found(views)[0] == ("link", f"g1-{SW}", "down")


def test_one_connection_that_cannot_send_names_its_link_then_the_switch() -> None:
    suspects = down_faults([view(1, "g0", "g1", 1.0, 5.0, 0)], {})
    assert [(s.target, round(s.score, 2)) for s in suspects] == [(f"g0-{SW}", 0.8), (SW, 0.55)]


def test_what_was_lost_beyond_the_sender_names_the_receivers_link() -> None:
    suspects = down_faults([view(1, "g0", "g1", 1.0, 5.0, 3)], {})
    assert suspects[0].target == f"{SW}-g1" and suspects[0].fault == "down"


def test_a_stall_after_the_networks_is_its_consequence() -> None:
    views = [view(1, "g0", "g1", 1.0, 5.0, 0), view(2, "g1", "g2", 1.0, 5.0, 0)]
    assert found(views, {1: T0 + 0.9}) == []  # a fabric connection stalled first
    assert found(views, {1: T0 + 1.5})[0] == ("switch", SW, "down")  # it stalled after


def test_a_short_wait_is_no_stall() -> None:
    v = view(1, "g0", "g1", 1.0, 1.5, 0)
    assert longest_stall(v) is None
    assert found([v]) == []


def test_a_connection_that_keeps_moving_is_no_stall() -> None:
    assert longest_stall(view(1, "g0", "g1", 10.0, 0.0, 0)) is None
