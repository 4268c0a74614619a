"""Faults inside a server: an NVLink link or a server's NVLink switch, from the connections
that cross them.

Every other detector reads the network: its switches' counters, queues and probes, and the
fabric connections' traced paths. NVLink is none of those: no controller polls an NVLink
switch, no probe crosses it, no tracer follows it. But the connections between GPUs of
one server have one path only, GPU -> the server's NVLink switch -> GPU (the fabric
model's), and their senders' samples say what they moved:

**Down.** A connection whose sender had work queued and moved nothing for
:data:`STALL_S` or more is stalled. With nothing in flight meanwhile (its kernel views'
unacknowledged segments 0), the sender could not send at all: its own NVLink port is down
(a GPU whose interface lost its carrier puts nothing on the wire); with data in flight,
the packets left and were lost beyond it: at the switch or on the receiver's link. Two
GPUs of one server that could not send, or senders of one server stalled towards
different receivers, point at the server's switch; one GPU that could not send, at its
link (and, less likely, the switch, whose other GPUs may have had nothing to send). The
evidence says how many GPUs it rests on.

What it cannot see: a slow NVLink link. Its connection's pace with data in flight would
say it (0.01 of the NVLink rate for a link slowed to 0.01), but healthy runs read as low:
0.01 over 0.6-1.5 s in healthy runs of the diagnosis suites of seeds 56-60 (the samples
and kernel views, every 10-50 ms, do not tell a connection's waits from its moves finely
enough; why was not looked into). A rule on that pace named a slow NVLink link in 112 of
those suites' 240 runs, and was not kept. Nor a loss on NVLink (no switch counts NVLink's
drops), nor any of these while the run goes (the live look does not read these
connections yet).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.diagnosis.model import Suspect
from orchestrator.results import ResultsBundle
from topologies.description import FabricDescription
from topologies.model import LinkKind

STALL_S = 2.0  # moved nothing this long with work queued: stalled (a hole's HOLE_S)
GAP_S = 0.15  # samples closer than this: the sender had work queued between them


@dataclass
class NvlinkView:
    """An NVLink connection's sender end: its two GPUs, the server's switch between them,
    the slower of its two links' emulated rates, and its samples."""

    id: int
    config_id: int
    src_gpu: str
    dst_gpu: str
    switch: str
    rate_bps: float
    samples: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes acked since)
    unacked: list[tuple[float, int]] = field(default_factory=list)  # (t, segments in flight)


def read_nvlink(
    bundle: ResultsBundle,
    description: FabricDescription,
    gpus_by_rank: Mapping[int, Mapping[int, str]],
) -> list[NvlinkView]:
    """The bundle's NVLink connections between two GPUs of one server (their senders' ends),
    with their samples; none from a bundle without the connections' links."""
    fabric = description.fabric
    port: dict[str, tuple[str, float]] = {}  # GPU -> (its NVLink switch, the link's rate)
    for link in fabric.links:
        if link.kind is not LinkKind.NVLINK:
            continue
        gpu, switch = (link.a, link.b) if link.a in fabric.gpus else (link.b, link.a)
        if gpu in fabric.gpus and switch not in fabric.gpus:
            port[gpu] = (switch, description.emulated_rate(link))
    views: dict[int, NvlinkView] = {}
    for c in bundle.connections():
        if c.link != "nvlink" or c.src_rank is None or c.dst_rank is None:
            continue
        if c.rank != c.src_rank:
            continue  # the receiver's end
        ranks = gpus_by_rank.get(c.config_id, {})
        src, dst = ranks.get(c.src_rank), ranks.get(c.dst_rank)
        if src not in port or dst not in port or port[src][0] != port[dst][0]:
            continue
        rate = min(port[src][1], port[dst][1])
        views[c.id] = NvlinkView(c.id, c.config_id, src, dst, port[src][0], rate)
    if not views:
        return []
    # only these connections' rows (the tables are indexed by connection): the fabric
    # connections' samples, most of the rows, are read by evidence.py already
    ids = ", ".join(str(int(cid)) for cid in views)
    for cid, t, nbytes in bundle.sql(
        f"SELECT connection_id, t, bytes FROM connection_samples WHERE connection_id IN ({ids})"
    ):
        views[cid].samples.append((t, nbytes))
    if bundle.has_table("tcp_info"):
        for cid, t, unacked in bundle.sql(
            f"SELECT connection_id, t, unacked FROM tcp_info WHERE connection_id IN ({ids})"
        ):
            views[cid].unacked.append((t, unacked))
    for view in views.values():
        view.samples.sort()
        view.unacked.sort()
    return list(views.values())


def longest_stall(view: NvlinkView) -> tuple[float, float, bool] | None:
    """The longest run of samples that moved nothing, back to back (the sampler ships a
    zero-byte sample only while work is queued), if it lasted :data:`STALL_S`: (start, end,
    whether anything was in flight during it)."""
    best: tuple[float, float] | None = None
    start: float | None = None
    last = 0.0
    for t, nbytes in view.samples:
        if nbytes == 0 and start is not None and t - last <= GAP_S:
            last = t
        elif nbytes == 0:
            start, last = t, t
        else:
            start = None
            continue
        if start is not None and (best is None or last - start > best[1] - best[0]):
            best = (start, last)
    if best is None or best[1] - best[0] < STALL_S:
        return None
    flying = any(best[0] <= t <= best[1] and n > 0 for t, n in view.unacked)
    return (best[0], best[1], flying)


def down_faults(views: Sequence[NvlinkView], fabric_first: Mapping[int, float]) -> list[Suspect]:
    """Down NVLink links and switches (the module docstring), from the stalls that began
    before any fabric connection of their configuration stalled (``fabric_first``: when
    its first did, by configuration): one that began after is the collective waiting on a hole in
    the network, its receiver no longer reading (seeds 56 and 58, run 22: a blackhole
    stalled the all-to-all's fabric connections, and an NVLink connection 0.2-0.5 s later)."""
    stalled = [
        (v, s)
        for v in views
        if (s := longest_stall(v)) is not None
        and s[0] < fabric_first.get(v.config_id, float("inf"))
    ]
    if not stalled:
        return []
    out = []
    by_switch: dict[str, list[tuple[NvlinkView, tuple[float, float, bool]]]] = defaultdict(list)
    for v, s in stalled:
        by_switch[v.switch].append((v, s))
    for switch, items in sorted(by_switch.items()):
        mute = sorted({v.src_gpu for v, (_, _, flying) in items if not flying})
        lost = [(v, s) for v, s in items if s[2]]
        onset = min(s[0] for _, s in items)
        listed = "; ".join(
            f"connection {v.id} {v.src_gpu} -> {v.dst_gpu}: {s[1] - s[0]:.1f} s, "
            + ("data in flight" if s[2] else "nothing in flight")
            for v, s in items[:4]
        )
        evidence = [
            f"transport: {len(items)} NVLink connection(s) through {switch} moved nothing "
            f"for {STALL_S:g} s or more with work queued ({listed})"
        ]
        receivers = {v.dst_gpu for v, _ in lost}
        if len(mute) >= 2 or (mute and receivers - set(mute)) or len(receivers) >= 2:
            evidence.append(
                f"paths: {', '.join(mute) or 'no GPU'} could not send at all (its NVLink port "
                f"looks down) and {len(lost)} sender(s) lost what they sent: more than one "
                f"GPU's link of {switch} at once, so the switch itself"
            )
            out.append(Suspect("switch", switch, "down", 0.85, evidence, onset))
        elif mute:
            gpu = mute[0]
            evidence.append(
                f"paths: {gpu} could not send at all (nothing in flight while its data "
                f"waited): its own NVLink port to {switch} looks down; its peers' links moved"
            )
            out.append(Suspect("link", f"{gpu}-{switch}", "down", 0.8, evidence, onset))
            # one GPU's view: a switch down whose other ports no connection tried looks so
            also = [*evidence[:1], f"paths: or {switch} itself, whose other GPUs sent nothing"]
            out.append(Suspect("switch", switch, "down", 0.55, also, onset))
        else:
            (gpu,) = receivers
            evidence.append(
                f"paths: what was sent to {gpu} was lost beyond the sender: {gpu}'s NVLink "
                f"link from {switch}, or the switch"
            )
            out.append(Suspect("link", f"{switch}-{gpu}", "down", 0.7, evidence, onset))
            out.append(Suspect("switch", switch, "down", 0.6, list(evidence), onset))
    return out
