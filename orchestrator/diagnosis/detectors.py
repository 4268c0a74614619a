"""The detectors: each reads one kind of evidence and names the components it points at.

Each returns :class:`~orchestrator.diagnosis.model.Suspect` objects with a score in [0, 1]
(how sure that evidence alone is) and the evidence as sentences; :mod:`.diagnose` merges
what several detectors say of the same component and ranks the result.

- :func:`port_events`: the switches' port-status messages, as the controller logged them.
  A link whose ends went down is ``down``; down and up again more than once is
  ``flapping``; most of one switch's links down within a second is that switch ``down``.
- :func:`switch_leaks` (used by the transport detectors): a switch whose ports received
  more than they transmitted dropped the difference at one of its egresses; with the
  egress queues' counters, only what no full queue discarded (congestion's drops) counts.
- :func:`full_queues`: switch ports whose egress queue was full (held bytes, discarded
  packets): where a slow direction's bytes wait.
- :func:`connection_faults`: the transport layer. Connections that stalled with data
  outstanding, that retransmitted far more than the others, or whose RTT rose far above
  their own healthy level, are explained by the one component on all their recorded paths
  and on few of the healthy connections' paths: a direction (``lossy`` or ``slow``), or a
  switch together with the one destination all the stalled connections share (``blackhole``:
  the switch forwards everything else).
- :func:`overfull_queues`: a switch port whose queue filled although what could reach
  it could not outrun it sends slower than its link's rate (``slow``).
- :func:`held_below_half`: a switch port that held a backlog interval after interval,
  offered no more than its rate, and sent about half its rate (``slow``).
- :func:`sending_below_rate`: a switch port that held a queue from one sample to the next
  and still sent far below its link's rate, sample after sample, or whose queue was found
  waiting at half its samples while it sent far below that share (``slow``): a queue
  waiting at a working port leaves at the port's rate.
- :func:`dropped_without_congestion`: a switch whose drops no full queue explains has a
  lossy egress, the one whose connections retransmitted most beyond the run's median.
- :func:`uncounted_losses`: retransmissions no counter explains (no discarding queue, no
  leaking switch on their paths), gathered on the link out of one GPU (``lossy``).
- :func:`stragglers`: a rank that enters the collective operations late, operation after
  operation, while the others wait for it: that GPU is a ``straggler``.
- :func:`controller_outage`: the controller's process started again during the run (its
  apps loaded again, every switch connected again), or its counter polling paused; but
  not when the run restarted it itself, to switch policy (:mod:`.restarts`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.diagnosis.evidence import ConnectionView, Direction, Observations, Port
from orchestrator.diagnosis.model import UNCOUNTED, Suspect
from topologies.model import Link, LinkKind, Tier

# A port's down and up messages closer than this are one event seen from both ends.
SAME_EVENT_S = 0.3
SWITCH_SHARE = 0.75  # of a switch's links down together: the switch is down
SWITCH_WINDOW_S = 1.0
LEAK_MIN_PACKETS = 8  # a switch receiving this many more packets than it sent dropped them
LEAK_MIN_BYTES = 16_000
# Dropped beyond what the switch's full queues report: a healthy run's are none, or up to
# 4 packets beside 400-600 its queues discarded (in flight at a sample); a blackhole's,
# the stalled connection's retransmissions into it (12-15 packets in 5 s); a lossy
# link's, tens to hundreds
SILENT_MIN_PACKETS = 5
# a switch's balance ends this long after the last operation: the fabric is quiet by then,
# and the run keeps sampling the counters and the queues past it (orchestrator/run/runner.py)
QUIET_AFTER_S = 1.0
# live, a switch's counters and its queues are sampled apart: packets that moved between
# the two samples read as dropped (at most this many beyond SILENT_MIN_PACKETS)
LIVE_LEAK_MARGIN = 10
#: live, a switch's balance is read at the cut and this long before it too, and the
#: least of its silent drops counts: a burst of a full queue's drops between its sample
#: and the counters' (bursts of 20-23 packets at one cut among 5-11 at the others, on
#: healthy 3:1 cores) reads as lost at one cut only, a loss at every one
LIVE_CUTS_S = (0.5, 1.0)
#: live, what a switch's queues held at a cut is read over this long before it
#: (:func:`_held_packets`; its counters and queues are sampled every 0.5 s)
HELD_LOOKBACK_S = 1.0
SILENT_SHARE = 0.03  # of the packets its full queues discarded (healthy: at most 0.01)
LOSSY_SILENT_MIN = 20  # unexplained drops that name a lossy egress, at least
LOSSY_OVER_QUEUED = 0.25  # ... and this share of its full queues' discards
# ... live, this share: mid-run the queues and the counters are read at other instants, and
# the balance jitters with the discards (healthy, replayed: 22 beside 88, 28 beside 76; a
# 3 % loss: 22 beside 6, then 33 beside 6)
LIVE_OVER_QUEUED = 1.0
BACKGROUND_SWITCHES = 6  # other switches dropping some too: a rate to compare (about_as_often)
QUEUE_DROPS_MIN = 5  # packets a full egress queue discarded over the run
QUEUE_MIN_BYTES = 24_000  # held at a switch's egress through the run: a shaped-down port
# a port whose full queue speaks for a slow link sent at most this share of its rate in any
# sampling interval meanwhile: ports slowed to a quarter sent 0.27 at most in the saved
# suites' fault windows; full queues of healthy all-to-alls' bursts, 0.3-0.57
FULL_PACE_MAX = 0.5
# a port fed no faster than its rate is full when QUEUE_MIN_BYTES or more were held in
# OVERFULL_SAMPLES samples (0.5 s apart), OVERFULL_BYTES or more in OVERFULL_PEAKS of them:
# fed by one connection at its own rate, its bursts held at most 37 KB at a sample over the
# 42 x 7 runs of the diagnosis suite (none of 40 KB); ports slowed to a quarter, 48-84 KB,
# at 40 KB or more in 2-13 samples (in 1 and 0 in two runs, which other rules caught)
OVERFULL_BYTES = 40_000
OVERFULL_SAMPLES = 3
OVERFULL_PEAKS = 2
OVERFULL_MARGIN = 1.0  # x its rate: what can arrive, at most, for a full queue to be its own
OVERFULL_SCORE = 0.85
OVERFULL_SENT = 0.5  # x its rate, sent while full: a working port (a quarter-rate one: 0.25)
OVERFULL_ELSEWHERE_SENT = 0.75  # ... another port full while sending under this: the fabric's
#: held_below_half: a backlog of this share of the port's queue at both ends of an interval,
#: in this many intervals in a row, each sent at most HALF_MAX of its rate, HALF_MEDIAN at
#: the median (a port at half its rate under one connection: 0.46-0.51)
HALF_QUEUE_SHARE = 0.25
#: a switch port's queue holds 10 ms of its rate, 16 full frames at least
#: (orchestrator/emulation/shaping.py, ShapingRecipe.queue_bytes)
QUEUE_S, QUEUE_MIN_FRAMES, FRAME_BYTES = 0.010, 16, 1514
HALF_INTERVALS = 6
HALF_MAX = 0.65
HALF_MEDIAN = 0.55
HALF_SCORE = 0.8
BACKLOG_BYTES = 20_000  # held at both ends of a sampling interval: the port had work
BACKLOGGED_INTERVALS = 4  # such intervals for a port's pace to be read
BELOW_RATE = 0.35  # x its rate, in every such interval: a quarter-rate link sends 0.18-0.27,
# healthy ports 0.34-1.0 (their backlog a single 64 KiB GSO packet, gone between samples)
BELOW_RATE_SCORE = 0.9
# A port's queue sampled non-empty at a share of instants was sending at its rate that
# share of the time at least (work conservation; the polls are not timed to the traffic).
# Over BUSY_WINDOW samples, a queue that held BUSY_BYTES in BUSY_SHARE of them or more
# while the port sent at most BUSY_BELOW_RATE of its rate, and at most BUSY_RATIO of that
# share, sends slower than its link: in the suites of seeds 16-23 ports slowed to a quarter
# read 0.23-0.43 (sent / share), healthy ones 0.46 and more (a failover's, 0.75 busy at
# 0.34) and up to 0.55 busy all the time: the emulator does not always drain a port at its
# rate, hence the margin
BUSY_WINDOW = 8
BUSY_BYTES = 15_000
BUSY_SHARE = 0.5
BUSY_BELOW_RATE = 0.35
BUSY_RATIO = 0.45
BUSY_SCORE = 0.8
# ... and a switch port's queue discarded this many packets over the window: the slowed
# switch ports this reading found in the saved suites (seeds 56-63) discarded 19-76; two
# healthy ones it read slow, none (seed 63 run 12, a pinned mix's ToR uplink, and seed 64
# run 36, an ECMP mix's 2:1 core uplink: found waiting at 4 of 8 samples while sending
# 0.16-0.22 of their rate, the emulator not draining them at their rate)
BUSY_DROPS_MIN = 5
OFTEN_ELSEWHERE_FACTOR = 0.5  # ... another link's port read so at the same time
# Either reading (by the share of samples found waiting, or by discards) is worth this
# much when the operations meanwhile ran within AS_FORECAST of the calibrated forecast
# (median; _unless_as_forecast)
AS_FORECAST = 1.05
AS_FORECAST_FACTOR = 0.5
# A queue discards only when full, and a full queue has work: in every sampling interval
# in which a port's queue discarded packets it was busy, and a busy port sends at its
# rate. DROPPING_INTERVALS such intervals in a row, each sent at DROPPING_BELOW_RATE of
# the port's rate or less (and at DROPPING_MIN_RATE at least: a port that sent nothing
# while discarding is down, or its counters stale, not slow), read slow. In the saved
# suites of seeds 16-26 (2,663 ports with three such intervals or more): ports slowed to a
# quarter did so in 20 runs (0.16-0.26 each); no port of 110 healthy runs did (with three
# in a row, two did); 4 ports in runs of other faults did (a controller outage's, a
# straggler's stalled traffic), which those faults' own suspects outscore (DROPPING_SCORE)
# A GPU's NIC port queues differently: TCP hands its qdisc whole 64 KiB GSO packets, which
# a healthy port drains in 40 ms at 12 Mbit/s, so a sample that finds 25-70 KB waiting says
# little about the 0.5 s after it (a healthy all-to-all's GPU, seed 30: found so at 4
# samples in a row while the ToR received 0.22-0.32 of the rate); and TCP's small queues
# keep at most two of a socket's packets there, 12 KB for one connection, which a slowed
# port then holds at nearly every sample (seed 30: 11 of 13 while the ToR received 0.2-0.25).
# So a GPU's port is read by the share of samples only, at this many bytes and this share,
# and only when it is the one GPU port of the run that reads slow so
# (7 of 8 samples: GPU ports of healthy ECMP all-to-alls on a rail-optimized fabric,
# seed 34, and one beside a lossy link were found waiting at 6 of 8 while their ToR
# received 0.25-0.27 of the rate; the slowed port of seed 30, at 11 of 13)
NIC_BUSY_BYTES = 3_000
NIC_BUSY_SHARE = 0.875
# ... and the converse: connections held under their share by a GPU's own slow port wait
# in its queue (a quarter-rate port: found waiting at 11 of 13 samples, above), so a GPU
# port whose queue was found waiting at under NIC_IDLE_SHARE of NIC_IDLE_MIN samples or
# more while they were held did not hold them (a healthy all-to-all across a 3:1 edge,
# seed 33: its GPU's connections held at 0.33-0.41 of their share, its queue waiting at
# 1 sample of 12: the edge's uplinks held them, where no model of fair shares sees TCP's
# unequal ones)
NIC_IDLE_SHARE = 0.25
NIC_IDLE_MIN = 4
NIC_IDLE_FACTOR = 0.5
# A switch's port, the same (these four figures serve both): slower than its senders, it
# keeps their bytes waiting while they are held, whether or not it discards. The saved
# suites' slowed switch links (seeds 56-64), the direction that discarded most: 3,000 bytes
# or more waiting at 4-14 of 12-14 samples in the fault's window, but one at 1 of 13 (a run
# the diagnosis missed anyway); a link slowed both ways, its direction that carried
# little: 0 and 3 of 13. A port that TCP's bursts overflow discards with its queue empty
# between them: astral-small's calibration run under `shortest`, three ring connections
# converging on p0r1a1>c3 from two ToRs, held at 0.25-0.38 of their share for 4 s while
# the port sent 0.35-0.42 of its rate and discarded 112 packets, found waiting at 1 of 15
# samples, alerted live at 0.57 (and an all-to-all's GPU downlink so at 0.85): read alike,
# a port idle at its samples did not hold them
# A slow suspect that one connection's pace alone speaks for (no queue or counter of its
# own, the switch's queue sampled and not full): each direction of that path is as likely
# (seed 33: three healthy all-to-alls alerted live at 0.55 on every direction of a lone
# connection held at 0.37-0.42 of its share for 3 s)
LONE_SLOW_FACTOR = 0.8
DROPPING_INTERVALS = 4
DROPPING_BELOW_RATE = 0.28
DROPPING_MIN_RATE = 0.02
DROPPING_SCORE = 0.7
# ... and its queue found holding DROPPING_HELD_BYTES at this share of the samples over
# those intervals at least: a slowed port keeps a standing queue (a quarter-rate port's
# 16 frames take 65 ms to drain, and TCP refills them), found at 0.25-1.00 of the samples
# in the suites of seeds 33-38; a healthy port whose queue overflows only in an
# all-to-all's bursts drains them at its rate in milliseconds and was found holding at
# 0.00-0.09 (a 5-minute calibration run of 64 KiB to 4 MiB on astral-small: ten healthy
# ports read slow so, after the run and live)
DROPPING_HELD_BYTES = 3_000
DROPPING_HELD_SHARE = 0.15
# ... and its queue discarded this share of the packets it sent over those intervals at
# least: TCP senders that a slowed port holds far under their pace keep overflowing its
# queue, where a port that overflows in an all-to-all's bursts discards a packet now and
# then. In the saved suites of seeds 56-60, the eleven slowed ports read so discarded
# 0.07-0.45 of what they sent; one healthy core uplink (seed 60 run 48, a pinned mix, 1-4
# discards per interval around an empty queue at 0.21 of its rate) 0.016, a false alarm
DROPPING_SHARE = 0.03
UNCOUNTED_MIN = 20  # segments retransmitted that no counter explains, on one GPU's link out
UNCOUNTED_SURE = 40  # ... this many: surely a loss (healthy: at most 6 on one link, 29 in all)
UNCOUNTED_PAD_S = 1.0  # a queue's discard is retransmitted within this (RTTs, timeouts)
# A lossy link drops its share of every packet while the fault lasts, so a connection
# across it retransmits again and again; unexplained retransmissions all within this long
# are one burst, a timeout that resent its window (its data or its acknowledgements lost
# anywhere: seed 63 run 21, a healthy pinned sweep whose connection resent 25 segments in
# 60 ms with no queue on its way discarding, was called a lossy GPU link at 0.54). The
# losses out of a GPU in the saved suites came 3 to 22 times over 1.4 to 16 s; 1 s
# delayed a live alert by a look (seed 62 run 29: its connections' first second)
UNCOUNTED_SPREAD_S = 0.5
#: live, retransmissions this recent are not read out of a GPU yet: a discard that caused
#: them may fall after the queues' last sample (every 0.5 s, read as they come)
UNCOUNTED_LIVE_LAG_S = 1.0
# bytes per dropped packet below which the drops were acknowledgements (54 bytes each):
# a healthy ECMP all-to-all on a fat-tree lost 10-21 of them at three switches, with
# nothing retransmitted for it; a loss on a data path averages 1.5-5 KB
ACK_BYTES = 200
MIN_FRAME_BYTES = 60  # an Ethernet frame without its FCS, at least (as the counters count it)
DATA_BYTES = 1448  # a data segment carries a whole MSS (1500-byte frames) or more, mostly
ACK_WAY = 0.5  # of a switch's unexplained drops, acknowledgements at least: the ACKs' way
HOLE_S = 2.5  # stalled this long: a hole (a loss's timeouts back off 0.2, 0.4, 0.8 s ...)
# the workers ship their samples every 0.2 s: a run still going sees a connection's last
# bytes that much later, more on a busy machine
LIVE_LAG_S = 0.5
STALL_S = 1.0  # no byte acknowledged for this long with data outstanding (an RTO after a
# shaper drop stalls a connection for 0.2-0.6 s; a hole, for as long as it lasts)
RETRANS_MIN = 40  # segments: a lost 64 KiB packet is 45 of them; fewer is a shaper's tail drop
CONGESTION_SHARE = 0.2  # full queues' discards on a lossy GPU egress's paths, x its retransmissions
RETRANS_FACTOR = 4.0  # x the median connection's
BOTH_ENDS_MIN = 16  # ... and below this at the fewer end, the transport must agree
BOTH_ENDS_SURE = 40  # packets unexplained at each end of a link: a loss on it, surely
LOSS_EXCESS = 10  # segments each beyond the median: a loss's connections retransmitted so
# a connection stalled in a hole retransmits one segment at a doubling timeout (8 ms, 16,
# ... 4 s): some 10 to 20 times in several seconds
HOLE_RETRANS_MIN = 5
CASCADE_S = 1.0  # a hole's connections stall together; those that wait for them, later
# One connection stalled, and no switch's counters saying it dropped anything: a healthy
# run's first operation shows that now and then (one connection 1.2 s at its start, a lost
# first segment under the kernel's 1 s initial timeout); alone it stays under the line
LONE_STALL = 0.6
# ... unless it stalled this long, retransmitting into it (HOLE_RETRANS_MIN): the longest
# stall of a connection in the saved suites' healthy runs and other faults' was 2.9 s
# (beside most of a run's connections stalled at once, 10.6 s: the workers' pause)
LONE_HOLE_S = 4.0
VIEW_GAP_S = 1.0  # ... looked at all through it: views no further apart than this
GLOBAL_SHARE = 0.5  # of the connections anomalous at once: the machine, not a component
CAPPED_SHARE = 0.4  # of the typical busy connection's peak rate: below a collision's half
CAPPED_SHARE_FAIR = 0.5  # the same, each peak over its fair share (collisions accounted for)
CAPPED_SECONDS = 3  # busy seconds at that pace
LOW_DENSITY = 0.5  # ... and that share of its busy seconds from the first such to the last
PEAK_WINDOW_S = 0.03  # three of the workers' 10 ms samples
# Sending pace: consecutive samples that moved bytes at most this far apart belong to one
# transfer (a 6 kB packet every 16 ms at a quarter of a 12 Mbit/s link); a longer gap is
# the collective making the connection wait.
SENDING_GAP_S = 0.1
# ... but within a second whose gaps between such samples are typically short, a gap of
# more than SENDING_GAP_FACTOR times the typical one (at least SENDING_GAP_MIN_S) is a
# wait too: a ring's connection on a full-rate link sends its 128 KiB chunk in 90 ms and
# waits about as long for the step's slower links, which a fixed 0.1 s counted as
# sending (a healthy ring read at 0.38-0.45 of its share, a false slow link)
SENDING_GAP_FACTOR = 3.0
SENDING_GAP_MIN_S = 0.03
SENDING_MIN_S = 0.2  # of sending in a second for its pace to count
#: a connection a link holds below its share waits in that link's queue: its smoothed
#: round trip is this many microseconds at least (a 1500-byte frame takes 1 ms at 12
#: Mbit/s, 4 ms at a quarter of it). The wire's own is under 1 ms (the workers sleep the
#: emulated latency, docs/latency.md); a small message's connection (8 KB a ring step at
#: 64 KiB) paces at a tenth of its share with nothing queued
QUEUED_RTT_US = 3000
#: ... above the wire's own round trip: the least the connection had, up to this much
#: per switch on its path (the userspace switches forward in turn: 4.0-4.6 ms across a
#: 3-pod fat-tree's core, 5 switches, nothing queued, seed 50); a least beyond it was
#: queued from the first sample (a link slow from the start)
WIRE_PER_SWITCH_US = 1000
KEPT_SHARE = 0.75  # of its fair share, median while a slow link held others under theirs
SENDING_SHARE = 0.45  # of its fair share: a link slowed to a quarter measures 0.2-0.3,
# healthy connections (collisions, ECMP, a busy machine) at least 0.29 in one second and
# at least 0.48 in a third one (the saved diagnosis suite's 10 healthy runs)
LATE_S = 0.020  # entry lateness beyond the typical rank's: healthy ranks stay within 18 ms
LATE_OPS = 2  # operations a straggler must be late in (two: consecutive ones)
# ... and the share of the operations between its first and last late one that it is late
# in: a straggler pays its delay in every operation while it lasts; a busy 2-core machine
# delays one rank now and then (a healthy run: iterations 2, 5 and 6, 3 of those 5)
LATE_SHARE = 0.75
# ... and in only two operations, late by at least this much in each: a busy machine
# delays a rank by 21-31 ms in two operations back to back now and then (live alerts on 3
# of 10 healthy runs of the diagnosis suite, seed 2), a straggler pays its whole delay
TWO_LATE_S = 0.050
# ... and so in three (a healthy run right after Open vSwitch started: rank 0 late by 24 ms
# in operations 9, 10 and 12 of 12, a live alert): fewer late operations than this count
# only when late by TWO_LATE_S
FEW_LATE_OPS = 4
# a rank late by this many times the next latest rank's lateness is late alone: seed 8's
# straggler entered 175-291 ms late while two other ranks were 20-45 ms late behind a
# congested 2:1 aggregation, in 2 of its 5 late operations
DOMINANT = 5.0
TELEMETRY_GAP_S = 2.0


def rel(obs: Observations, t: float) -> str:
    """``t`` as seconds after the first timed operation began."""
    span = obs.span
    return f"+{t - span[0]:.2f} s" if span else f"{t:.2f}"


# --- the network layer: port status -----------------------------------------------------------


def port_events(obs: Observations) -> list[Suspect]:
    fabric = obs.fabric
    link_of: dict[tuple[str, int], Link] = {}
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        for node in (link.a, link.b):
            if node in fabric.switches:
                link_of[(node, link.port_of(node))] = link
    episodes: dict[str, list[tuple[float, float | None, str]]] = defaultdict(list)
    names = {}
    for e in obs.events:
        if e.kind not in ("port-down", "port-up") or e.switch is None or e.port is None:
            continue
        found = link_of.get((e.switch, e.port))
        if found is None:
            continue
        name = f"{found.a}-{found.b}"
        names[name] = found
        eps = episodes[name]
        where = f"{e.switch} port {e.port}"
        if e.kind == "port-down":
            if eps and eps[-1][1] is None:
                continue  # the other end of the same down
            if eps and eps[-1][1] is not None and e.t - eps[-1][1] < SAME_EVENT_S:
                continue
            eps.append((e.t, None, where))
        elif eps and eps[-1][1] is None:
            eps[-1] = (eps[-1][0], e.t, eps[-1][2])
    suspects: list[Suspect] = []
    explained: set[str] = set()
    for switch in fabric.switches:
        # its links by name: parallel links to one neighbour are one link, which a fault
        # takes down whole (seed 65 run 4: a flap of one of an aggregation switch's two
        # links, four parallel ones to its core, read as 4 of its 5 ports: the switch down)
        mine = sorted(
            {f"{x.a}-{x.b}" for x in fabric.links_of(switch) if x.kind is not LinkKind.NVLINK}
        )
        if not mine:
            continue
        starts = sorted(episodes[n][0][0] for n in mine if episodes.get(n))
        if len(starts) < max(2, SWITCH_SHARE * len(mine)):
            continue
        first = starts[0]
        together = [t for t in starts if t - first <= SWITCH_WINDOW_S]
        if len(together) < SWITCH_SHARE * len(mine):
            continue
        ups = [u for n in mine if episodes.get(n) and (u := episodes[n][0][1]) is not None]
        back = f", up again {rel(obs, min(ups))}" if ups else ", not up again in the run"
        suspects.append(
            Suspect(
                "switch",
                switch,
                "down",
                0.95,
                [
                    f"controller: {len(together)} of the {len(mine)} links of {switch} went "
                    f"down within {SWITCH_WINDOW_S:g} s, at {rel(obs, first)}{back}",
                    "port-status from its own ports and from its neighbours' ports facing it",
                ],
                onset=first,
            )
        )
        explained.update(mine)
    for name, eps in episodes.items():
        if name in explained:
            continue
        first_episode = eps[0]
        if len(eps) >= 2:
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(eps)]
            evidence = [
                f"controller: link {name} went down {len(eps)} times ({first_episode[2]} first,"
                f" at {rel(obs, first_episode[0])}), every {statistics.median(gaps):.2f} s",
            ]
            suspects.append(
                Suspect("link", name, "flapping", 0.9, evidence, onset=first_episode[0])
            )
        else:
            down, up, where = first_episode
            back = f", up at {rel(obs, up)}" if up is not None else ", not up again in the run"
            evidence = [f"controller: {where} (link {name}) down at {rel(obs, down)}{back}"]
            suspects.append(Suspect("link", name, "down", 0.9, evidence, onset=down))
    return suspects


# --- the network layer: counters --------------------------------------------------------------


@dataclass(frozen=True)
class Leak:
    """What a switch dropped inside over the run: ``packets`` and ``nbytes`` its ports
    received and did not send, ``queued`` of those packets its egress queues report
    discarding (None: its queues were not sampled), ``emulator`` of them the switch
    process never read (its ports' sockets full: :attr:`Observations.ingress`)."""

    packets: int
    nbytes: int
    queued: int | None = None
    emulator: int = 0
    received: int = 0  # packets its ports received meanwhile (0: not counted)

    @property
    def silent(self) -> int:
        """Packets dropped that no queue and no socket of the emulator reports: a lossy
        link's or a drop rule's (all of them when the queues were not sampled)."""
        return self.packets - (self.queued or 0) - self.emulator

    def silent_acknowledgements(self) -> bool:
        """Whether the packets no queue and no socket reports were acknowledgements only
        (under :data:`ACK_BYTES` a packet), counting every other packet the switch dropped
        as a minimum frame at least: what is left of the bytes is at most theirs. Seed 51
        run 18, a healthy pinned all-to-all: an aggregation switch 46 packets short in 4,328
        bytes, 5 of them its queues' discards, was one end of a link 'lossy both ways'
        at 0.79 beside a core that lost acknowledgements only; the 41 unreported packets
        were 98 bytes each at most."""
        if not self.queued and self.nbytes < ACK_BYTES * self.packets:
            return True  # every packet it dropped was that small
        rest = self.nbytes - MIN_FRAME_BYTES * (self.packets - self.silent)
        return self.silent > 0 and rest < ACK_BYTES * self.silent

    def describe(self, switch: str) -> str:
        said = (
            f"counters: {switch} received {self.packets:,} packets ({self.nbytes:,} bytes) "
            "more than it sent"
        )
        unread = (
            f", {self.emulator:,} the switch process never read (the emulator's: its sockets full)"
            if self.emulator
            else ""
        )
        if self.queued is None:
            return f"{said}{unread}: dropped at one of its egresses"
        if not self.queued:
            return (
                f"{said}{unread}, and none of its egress queues dropped any: dropped, not congested"
            )
        return (
            f"{said}{unread}; its egress queues dropped {self.queued:,} of them (full), "
            f"{self.silent:,} more were dropped without a full queue"
        )


def switch_leaks(obs: Observations) -> dict[str, Leak]:
    """Switches that dropped packets inside over the run, beyond what their full egress
    queues discarded: what enters a switch leaves it, so a switch whose ports' receive
    counters add up to more than their transmit counters dropped the difference inside,
    at an egress (a lossy link's drops, a drop rule's and an overflowing shaper's all
    happen before the port counts a transmission). The shapers' own counters
    (:attr:`Observations.queues`) say how many of those a full queue discarded: the rest
    is a drop no congestion explains (at least :data:`SILENT_MIN_PACKETS`). A bundle
    without queue samples keeps every drop, at :data:`LEAK_MIN_PACKETS` and
    :data:`LEAK_MIN_BYTES` (congestion's drops included). Counted from the last sample
    before the run's first bytes (its connections' first samples; the warm-up operation
    comes before the first timed one, and packets in flight at a sample are received and
    not yet sent: up to 14 measured) to the last one a second after the last operation:
    the fabric is quiet at both ends. Live, to the cut, with the queue samples so far
    (:attr:`Observations.live_queues`): the fabric is not quiet then, so what the
    queues held at the cut is not counted as dropped, and :data:`LIVE_LEAK_MARGIN` more
    packets are allowed for the counters and the queues being sampled apart."""
    window = leak_window(obs)
    if window is None:
        return {}
    start, end = window
    live = reads_live(obs)
    if live:
        # live, the fabric is not quiet at the cut: what its queues hold then was
        # received and not yet sent, and is taken off (LIVE_LEAK_MARGIN: the rest)
        obs, end = _with_live_queues(obs), obs.now or end
    ports: dict[str, list[int]] = defaultdict(list)
    for switch, port in obs.counters:
        ports[switch].append(port)
    out = {}
    for switch, numbers in ports.items():
        leak = (_live_balance if live else _balance)(obs, switch, numbers, start, end)
        if leak is None:
            continue
        if leak.queued is not None:
            least = SILENT_MIN_PACKETS + (LIVE_LEAK_MARGIN if live else 0)
            if leak.silent >= max(least, SILENT_SHARE * leak.queued):
                out[switch] = leak
        elif leak.silent >= LEAK_MIN_PACKETS and leak.nbytes >= LEAK_MIN_BYTES:
            out[switch] = leak
    return out


def leak_window(obs: Observations) -> tuple[float, float] | None:
    """Where :func:`switch_leaks` reads a switch: from the last sample before the run's
    first bytes to a second after its last operation (quiet at both ends); None before the
    run's span is known."""
    span = obs.span
    if span is None:
        return None
    first = min((c.samples[0][0] for c in obs.connections if c.samples), default=span[0])
    return min(span[0], first) - 0.5, span[1] + QUIET_AFTER_S


def reads_live(obs: Observations) -> bool:
    """Whether ``obs`` is a live look with the queue samples so far
    (:attr:`Observations.live_queues`) in place of a finished run's."""
    return obs.now is not None and not obs.queues and bool(obs.live_queues)


def live_silent(obs: Observations, switch: str, start: float, end: float) -> int:
    """Packets ``switch`` dropped between ``start`` and ``end`` that no full queue explains,
    read live as :func:`switch_leaks` reads a switch (:func:`_live_balance`); 0 when a
    port or queue was not sampled."""
    ports = sorted(port for node, port in obs.counters if node == switch)
    leak = _live_balance(_with_live_queues(obs), switch, ports, start, end)
    return max(0, leak.silent) if leak is not None and leak.queued is not None else 0


def window_silent(obs: Observations, switch: str, start: float, end: float) -> int:
    """Packets ``switch`` dropped between ``start`` and ``end`` that no full queue explains,
    read from its ports' balance less what its queues held at ``end`` (a window's end may
    be busy: its packets in flight are received and not sent yet); 0 when a port or queue
    was not sampled. :func:`live_silent` reads a live cut so, at three instants."""
    ports = sorted(port for node, port in obs.counters if node == switch)
    leak = _balance(obs, switch, ports, start, end, True)
    return max(0, leak.silent) if leak is not None and leak.queued is not None else 0


def _live_balance(
    obs: Observations, switch: str, numbers: Sequence[int], start: float, end: float
) -> Leak | None:
    """:func:`_balance` live (``obs`` with the live queue samples in place): less what the
    queues held at ``end``, and the least of that reading and those :data:`LIVE_CUTS_S`
    earlier (a burst of drops between a queue's sample and the counters' reads as lost
    at one cut and not the next; a loss keeps counting)."""
    leak = _balance(obs, switch, numbers, start, end, True)
    if leak is None or leak.queued is None:
        return leak
    cuts = [_balance(obs, switch, numbers, start, end - back, True) for back in LIVE_CUTS_S]
    return min((x for x in (leak, *cuts) if x is not None), key=lambda x: x.silent)


def _balance(
    obs: Observations,
    switch: str,
    numbers: Sequence[int],
    start: float,
    end: float,
    live: bool = False,
) -> Leak | None:
    """:func:`switch_leaks`' reading of one switch from ``start`` to ``end``: packets and
    bytes its ports received and did not send (live, less what its queues held at
    ``end``), with what its queues discarded (``queued`` None: not sampled). None when a
    port has no counter."""
    packets = nbytes = packets_in = bytes_in = 0
    for port in numbers:
        a, b = obs.counter_at((switch, port), start), obs.counter_at((switch, port), end)
        if a is None or b is None:
            return None
        packets += (b[3] - a[3]) - (b[4] - a[4])
        nbytes += (b[1] - a[1]) - (b[2] - a[2])
        packets_in, bytes_in = packets_in + b[3] - a[3], bytes_in + b[1] - a[1]
    dropped = [obs.queue_drops((switch, port), start, end) for port in numbers]
    unread = sum(obs.ingress_drops((switch, port), start, end) for port in numbers)
    if not obs.queues or any(d is None for d in dropped):
        return Leak(packets, nbytes, emulator=unread, received=packets_in)
    if live:
        packets -= _held_packets(obs, switch, numbers, end, packets_in, bytes_in)
    return Leak(packets, nbytes, sum(d or 0 for d in dropped), unread, packets_in)


def _held_packets(
    obs: Observations, switch: str, ports: Sequence[int], t: float, packets: int, nbytes: int
) -> int:
    """About how many packets ``switch``'s egress queues held at ``t``: per port, the
    most bytes its samples in the :data:`HELD_LOOKBACK_S` before ``t`` found (the last
    sample before it if none), over the mean size of the packets the switch received.
    The counters are read at another instant than the queues, and a full queue empties
    and fills between the two: one sample alone read a full queue as empty (0 bytes,
    where the ones 0.5 s around it held 25-28 KB), and 16 packets in flight as lost."""
    held = 0
    for port in ports:
        rows = obs.queues.get((switch, port), [])
        times = [r[0] for r in rows]
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            continue
        j = bisect.bisect_left(times, t - HELD_LOOKBACK_S, hi=i)
        held += max(r[3] for r in rows[j : i + 1])
    return round(held * packets / nbytes) if packets > 0 and nbytes > 0 else 0


def switch_queues(obs: Observations) -> dict[str, int]:
    """Switches holding a queue through the run: their fullest egress queue's bytes at its
    90th percentile over the samples (:func:`port_queues`), or, in a bundle without queue
    samples, the bytes received and not yet sent (the sum over its ports of receive minus
    transmit counters, from the run's start) at its 90th percentile. A port shaped below
    what its senders offer queues their bytes at this switch's egress; a healthy switch
    holds only what is in flight through it (under 6 KB measured at 12 Mbit/s ports)."""
    out: dict[str, int] = {}
    if obs.queues:
        for (switch, _), most in port_queues(obs).items():
            out[switch] = max(out.get(switch, 0), most)
        return out
    span = obs.span
    if span is None:
        return {}
    rounds: dict[str, dict[float, list[tuple[float, int, int, int, int]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for (switch, _), rows in obs.counters.items():
        for row in rows:
            if span[0] - 1.0 <= row[0] <= span[1] + 1.0:
                rounds[switch][row[0]].append(row)
    for switch, by_t in rounds.items():
        ports = max(len(rows) for rows in by_t.values())
        held = [
            sum(r[1] for r in rows) - sum(r[2] for r in rows)
            for _, rows in sorted(by_t.items())
            if len(rows) == ports
        ]
        if len(held) < 4:
            continue
        levels = sorted(h - held[0] for h in held)
        p90 = levels[int(0.9 * (len(levels) - 1))]
        if p90 >= QUEUE_MIN_BYTES:
            out[switch] = p90
    return out


def egress_ports(obs: Observations, d: Direction) -> list[Port]:
    """The ports ``d`` leaves its node by (a switch's, or a GPU's NIC port): one per link
    between its two nodes (parallel links share a name, ``A>B``, and the fabric model's
    ports tell them apart). A switch port's queue is in :attr:`Observations.queues`, a
    GPU's in :attr:`Observations.nic_queues`."""
    return [
        (d.src, link.port_of(d.src))
        for link in obs.fabric.links_of(d.src)
        if d.dst in (link.a, link.b) and link.kind is not LinkKind.NVLINK
    ]


def egress_queue(obs: Observations, port: Port) -> list[tuple[float, int, int, int]]:
    """``port``'s egress queue samples (a switch's or a GPU's NIC port's), oldest first;
    live, a switch port's are :attr:`Observations.live_queues`."""
    if port[0] not in obs.fabric.switches:
        return obs.nic_queues.get(port, [])
    return obs.queues.get(port) or obs.live_queues.get(port, [])


def slow_port_queues(obs: Observations) -> dict[Port, list[tuple[float, int, int, int]]]:
    """The switch ports' queue samples the slow-port readings read: the run's, or live,
    those so far (:attr:`Observations.live_queues`)."""
    return obs.queues or obs.live_queues


def full_queues(obs: Observations, window: tuple[float, float] | None = None) -> dict[Port, str]:
    """Switch ports whose egress queue was full during the run, each with what says so:
    it held :data:`QUEUE_MIN_BYTES` or more at its 90th percentile (:func:`port_queues`),
    or it discarded :data:`QUEUE_DROPS_MIN` packets or more. A port slower than what its
    senders offer does both; in a run without congestion nothing else does (an
    all-to-all's incast fills many queues, which the transport layer's evidence then
    has to tell apart). ``window`` (start, end): full then (a slow link's queue fills
    while it is slow; a port upstream of it that is the bottleneck the rest of the time
    fills only then)."""
    span = obs.span
    if span is None:
        return {}
    start, end = window or (span[0] - 0.5, span[1] + 1.0)
    out = {
        port: f"held {held:,} bytes (90th percentile{' then' if window else ''})"
        for port, held in port_queues(obs, window).items()
    }
    for port in obs.queues:
        dropped = obs.queue_drops(port, start, end) or 0
        if dropped >= QUEUE_DROPS_MIN:
            said = out.get(port)
            out[port] = (f"{said} and " if said else "") + f"discarded {dropped:,} packets full"
    return out


def port_queues(obs: Observations, window: tuple[float, float] | None = None) -> dict[Port, int]:
    """Switch ports whose egress queue held :data:`QUEUE_MIN_BYTES` or more at its 90th
    percentile over the run's samples (the shaper's backlog, :attr:`Observations.queues`):
    the port slower than what its senders offer, named exactly, where the counters' sum
    names only its switch. ``window`` (start, end): over its samples only."""
    span = obs.span
    if span is None:
        return {}
    start, end = window or (span[0] - 1.0, span[1] + 1.0)
    out = {}
    for port, rows in obs.queues.items():
        held = sorted(r[3] for r in rows if start <= r[0] <= end)
        if len(held) < 4:
            continue
        p90 = held[int(0.9 * (len(held) - 1))]
        if p90 >= QUEUE_MIN_BYTES:
            out[port] = p90
    return out


# --- the transport layer ----------------------------------------------------------------------


def stalls(c: ConnectionView, now: float | None = None) -> list[tuple[float, float]]:
    """Periods of at least :data:`STALL_S` in which ``c`` got nothing acknowledged while
    it had data outstanding (its kernel's unacknowledged segments), as (start, end).
    ``now`` (a run still going): a stall not over yet counts up to it, when the
    connection's last kernel view still held unacknowledged data (one that finished its
    step holds none) and it is longer than the samples' shipping lag allows
    (:data:`LIVE_LAG_S` more), and while its kernel views go on (a connection in a hole
    is looked at every 0.06 s; one whose configuration ended is looked at no more, its
    last view taken before its last acknowledgement: three healthy runs of the saved
    suites alerted live on such a connection's "stall" between two configurations);
    without ``now`` a stall is seen only once bytes move again."""
    out = []
    last_progress: float | None = None
    for t, nbytes in c.samples:
        if nbytes > 0:
            if last_progress is not None and t - last_progress >= STALL_S:
                out.append((last_progress, t))
            last_progress = t
        elif last_progress is None:
            last_progress = t
    found = [(a, b) for a, b in out if _outstanding(c, a, b)]
    open_since = last_progress if c.unacked and c.unacked[-1][1] > 0 else None
    if (
        now is not None
        and open_since is not None
        and now - open_since >= STALL_S + LIVE_LAG_S
        and now - c.unacked[-1][0] <= STALL_S + LIVE_LAG_S
    ):
        found.append((open_since, now))
    return found


def _outstanding(c: ConnectionView, start: float, end: float) -> bool:
    """Whether the kernel held unacknowledged data for most of [start, end] (a connection
    merely waiting for the collective's next step has none). The workers stop sampling a
    connection that moves nothing, so its last view before ``start`` and its first after
    ``end`` count too, and so does a retransmission count that rose across the gap."""
    before = [u for t, u in c.unacked if t <= start]
    after = [u for t, u in c.unacked if t > end]
    views = before[-1:] + [u for t, u in c.unacked if start < t <= end] + after[:1]
    # retransmitting across the gap: data was outstanding, whatever the views sampled
    prior = [r for t, r in c.retrans if t <= start]
    later = [r for t, r in c.retrans if t > end]
    if prior and later and later[0] > prior[-1]:
        return True
    return bool(views) and sum(1 for u in views if u > 0) >= 0.5 * len(views)


def _first_stalled(
    stalled: dict[int, list[tuple[float, float]]],
) -> dict[int, list[tuple[float, float]]]:
    """The connections whose longest stall began within :data:`CASCADE_S` of the first
    one's: a hole stalls its own connections at once; the collective's others run on
    until they wait for them, and then time out too (an all-to-all's receivers stop
    reading: 1.2-2.6 s after the hole's, with a few retransmissions of their own)."""
    begun = {cid: max(s, key=lambda ab: ab[1] - ab[0])[0] for cid, s in stalled.items()}
    if not begun:
        return stalled
    first = min(begun.values())
    return {cid: s for cid, s in stalled.items() if begun[cid] <= first + CASCADE_S}


def retransmissions(c: ConnectionView, start: float, end: float) -> int:
    inside = [r for t, r in c.retrans if start <= t <= end]
    before = [r for t, r in c.retrans if t < start]
    if not inside:
        return 0
    return max(inside) - (before[-1] if before else min(inside))


def retransmitted_across(c: ConnectionView, stall: tuple[float, float]) -> int:
    """Segments ``c`` retransmitted over ``stall`` (start, end): its kernel's total at the
    first view from the end on, less the last one up to the start. The workers stop
    sampling a connection that moves nothing, so the views around a stall are all there
    is; without one before it, the first view stands in (fewer, not more)."""
    if not c.retrans:
        return 0
    start, end = stall
    before = [r for t, r in c.retrans if t <= start]
    after = [r for t, r in c.retrans if t >= end]
    first = before[-1] if before else c.retrans[0][1]
    last = after[0] if after else c.retrans[-1][1]
    return max(0, last - first)


def retransmitted_in_longest(c: ConnectionView, spans: Sequence[tuple[float, float]]) -> int:
    """Segments ``c`` retransmitted across the longest of its stalls ``spans`` (0 without
    any)."""
    if not spans:
        return 0
    return retransmitted_across(c, max(spans, key=lambda ab: ab[1] - ab[0]))


def _lossy_outside(
    c: ConnectionView,
    spans: Sequence[tuple[float, float]],
    everyone: Sequence[ConnectionView],
) -> bool:
    """Whether ``c`` retransmitted as a lossy connection does (:data:`RETRANS_MIN`, and
    :data:`RETRANS_FACTOR` x the median connection's) outside the longest of its stalls
    ``spans``: a connection that lost that much all along was in congestion, whose
    timeouts back off to a long stall (seed 61 run 21, a healthy pinned sweep on a 3:1
    ToR: one connection stalled 4.9 s after 99 retransmissions elsewhere, the median 8,
    called a blackhole at 0.54); one dropped into a hole loses in the hole."""
    if not spans or not c.retrans:
        return False
    # the kernel's count since the connection opened, not since its first view: a
    # connection is looked at only while it has data outstanding, and a congested one's
    # first view may come after most of its losses (seed 61 run 21: 51 retransmitted at
    # its first view, so that live, 1 s after its stall, it had 22 since then)
    typical = statistics.median(x.retrans[-1][1] for x in everyone if x.retrans)
    outside = c.retrans[-1][1] - retransmitted_in_longest(c, spans)
    return outside >= max(RETRANS_MIN, RETRANS_FACTOR * typical)


def _viewed_throughout(c: ConnectionView, spans: Sequence[tuple[float, float]]) -> bool:
    """Whether ``c``'s kernel was looked at all through the longest of its stalls
    ``spans``, no two views (the last before it and the first after it included)
    :data:`VIEW_GAP_S` or more apart (False without any): a connection in a hole is
    looked at every 0.06 s, while a pause of the workers' sampler leaves a gap in every
    connection's views (seed 55 run 33, a healthy sweep: one connection's views 4.1 s
    apart, read live as a lone 4 s stall)."""
    if not spans:
        return False
    a, b = max(spans, key=lambda ab: ab[1] - ab[0])
    times = [t for t, _ in c.unacked]
    i = max(bisect.bisect_right(times, a) - 1, 0)
    j = bisect.bisect_left(times, b)
    seen = times[i : j + 1]
    return bool(seen) and all(y - x < VIEW_GAP_S for x, y in itertools.pairwise(seen))


def _first_retransmission(c: ConnectionView, start: float) -> float | None:
    """When ``c`` first retransmitted after ``start`` (its kernel's total went up)."""
    before = [r for t, r in c.retrans if t < start]
    level = before[-1] if before else (c.retrans[0][1] if c.retrans else 0)
    return next((t for t, r in c.retrans if t >= start and r > level), None)


def peak_rates(c: ConnectionView) -> dict[int, float]:
    """Per whole second of the run: the connection's highest rate over
    :data:`PEAK_WINDOW_S` (bytes/s), in the seconds it moved anything. A connection sends
    at its path's pace whenever it sends, however long the collective then makes it wait;
    the window is shorter than one chunk's transfer (a ring step's 64 KiB take 43 ms at
    12 Mbit/s), so that waiting between chunks does not count as slowness."""
    windows: dict[int, float] = defaultdict(float)
    for t, nbytes in c.samples:
        windows[int(t / PEAK_WINDOW_S)] += nbytes
    out: dict[int, float] = {}
    for index, moved in windows.items():
        if moved > 0:
            second = int(index * PEAK_WINDOW_S)
            out[second] = max(out.get(second, 0.0), moved / PEAK_WINDOW_S)
    return out


def capped(
    conns: Sequence[ConnectionView], capacity: dict[str, float] | None = None
) -> dict[int, tuple[float, int, float, float]]:
    """Connections that, in :data:`CAPPED_SECONDS` or more of the seconds they were busy,
    peaked at no more than a share of what the typical busy connection peaked at that
    second: a slower link on their path. Each with its worst share, the number of such
    seconds, the first of them and the end of the last.

    Connections that share a link peak lower without any fault (two at half each: a
    collision). Without more to go on, the share is :data:`CAPPED_SHARE`, under a
    collision's half. Where every connection's whole path is known and ``capacity`` gives
    each link direction's rate, a connection's share is :data:`CAPPED_SHARE_FAIR` of what
    its fair share (the least, over its path's directions, of the rate over the busy
    connections crossing it) says it should get against the typical busy connection's: a
    collision no longer hides below the line, and a link slowed to a quarter shows even
    though its shaper's bucket (about R x 10 ms, however slow the link) inflates its 30 ms
    peaks to 0.36-0.49 of the typical connection's. A second in which nothing was
    queued on a connection's path (:func:`unqueued_seconds`) is never one of them."""
    peaks = {c.id: peak_rates(c) for c in conns}
    idle = {c.id: unqueued_seconds(c) for c in conns}
    seconds = sorted({s for p in peaks.values() for s in p})
    fair = capacity is not None and all(c.full_path for c in conns)
    low: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for second in seconds:
        busy = {cid: p[second] for cid, p in peaks.items() if second in p}
        if len(busy) < 3:
            continue
        typical = statistics.median(busy.values())
        line = dict.fromkeys(busy, CAPPED_SHARE)
        if fair:
            assert capacity is not None
            shares = _fair_shares([c for c in conns if c.id in busy], capacity)
            usual = statistics.median(shares.values())
            line = {cid: CAPPED_SHARE_FAIR * min(1.0, shares[cid] / usual) for cid in busy}
        for cid, rate in busy.items():
            # nothing queued on its path that second: no link held it (unqueued_seconds)
            if rate <= line[cid] * typical and second not in idle[cid]:
                low[cid].append((second, rate / typical))
    out = {}
    for cid, xs in low.items():
        share = dict(xs)
        run = _dense(list(share), peaks[cid])
        if run:
            out[cid] = (
                max(share[second] for second in run),
                len(run),
                float(run[0]),
                run[-1] + 1.0,
            )
    return out


def sending_pace(c: ConnectionView) -> dict[int, float]:
    """Per whole second: the bytes ``c`` moved while it was sending, over the time it was
    sending (bytes/s), in the seconds it sent for at least :data:`SENDING_MIN_S`. Sending
    is a run of samples that moved bytes no more than :data:`SENDING_GAP_S` apart, and no
    more than :data:`SENDING_GAP_FACTOR` times the second's median gap. Unlike
    a peak over 30 ms, the shaper's bucket does not inflate it, and unlike a rate over the
    whole second, the collective's waits do not deflate it."""
    moved: dict[int, float] = defaultdict(float)
    sending: dict[int, float] = defaultdict(float)
    points = [(t, n) for t, n in c.samples if n > 0]
    gaps: dict[int, list[float]] = defaultdict(list)
    for (t0, _), (t1, _) in itertools.pairwise(points):
        gaps[int(t1)].append(t1 - t0)
    limit = {
        second: min(
            SENDING_GAP_S, max(SENDING_GAP_MIN_S, SENDING_GAP_FACTOR * statistics.median(g))
        )
        for second, g in gaps.items()
    }
    for (t0, _), (t1, n1) in itertools.pairwise(points):
        if t1 - t0 <= limit[int(t1)]:
            moved[int(t1)] += n1
            sending[int(t1)] += t1 - t0
    return {s: moved[s] / sending[s] for s in moved if sending[s] >= SENDING_MIN_S}


def pace_shares(
    conns: Sequence[ConnectionView], capacity: dict[str, float]
) -> dict[int, dict[int, float]]:
    """Per connection, per whole second it sent in (:func:`sending_pace`): its pace over
    its fair share of its path that second (the fair share counts the connections sending
    through each link then). Seconds with fewer than three connections sending say too
    little and are left out; so is everything when some connection's whole path is not
    known."""
    if not conns or not all(c.full_path for c in conns):
        return {}
    paces = {c.id: sending_pace(c) for c in conns}
    idle = {c.id: unqueued_seconds(c) for c in conns}
    bytes_per_s = {d: bps / 8 for d, bps in capacity.items()}
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for second in sorted({s for p in paces.values() for s in p}):
        sending = [c for c in conns if second in paces[c.id]]
        if len(sending) < 3:
            continue
        fair = _fair_shares(sending, bytes_per_s)
        for c in sending:
            if second not in idle[c.id]:
                out[c.id][second] = paces[c.id][second] / fair[c.id]
    return out


def unqueued_seconds(c: ConnectionView) -> set[int]:
    """The whole seconds in which ``c``'s round trip (its kernel's smoothed one, median
    over the second's samples) stayed under :data:`QUEUED_RTT_US` above the least it
    had: nothing on its path held its bytes, so whatever its pace then, no link was what
    kept it down (its sender had no more to send: a small message between the workers'
    latency sleeps). Pace shares leave those seconds out, as neither held nor kept. Above
    the wire's own round trip (:data:`WIRE_PER_SWITCH_US`), not absolute: a path across a
    core has a round trip of its own (4-4.6 ms on a 3-pod fat-tree, seed 50, whose ring
    at 64 KiB then read as held at 13 % of its share across the core, a false alarm)."""
    by_second: dict[int, list[int]] = defaultdict(list)
    for t, rtt in c.rtt:
        by_second[int(t)].append(rtt)
    least = min((rtt for _, rtt in c.rtt if rtt > 0), default=0)
    wire = min(least, WIRE_PER_SWITCH_US * len(c.switches()))
    line = wire + QUEUED_RTT_US
    return {s for s, rtts in by_second.items() if statistics.median(rtts) < line}


def held_below_share(
    conns: Sequence[ConnectionView], capacity: dict[str, float]
) -> dict[int, tuple[float, int, float]]:
    """Connections whose sending pace (:func:`sending_pace`) stayed under
    :data:`SENDING_SHARE` of their fair share of their path in :data:`CAPPED_SECONDS` or
    more seconds: a link slower than the fabric model says. Needs every connection's whole
    path (:func:`pace_shares`); returns, as :func:`capped` does, the highest of those
    shares, their number and the first such second."""
    return _held_below(pace_shares(conns, capacity))


def _held_below(shares: dict[int, dict[int, float]]) -> dict[int, tuple[float, int, float]]:
    """:func:`held_below_share` on shares already computed (:func:`pace_shares`)."""
    out = {}
    for cid, mine in shares.items():
        run = _dense([second for second, share in mine.items() if share < SENDING_SHARE], mine)
        if run:
            out[cid] = (max(mine[second] for second in run), len(run), float(run[0]))
    return out


def _dense(low: Sequence[int], busy: Iterable[int]) -> list[int]:
    """The longest run of ``low`` seconds that are at least :data:`LOW_DENSITY` of the
    ``busy`` ones from its first to its last, if it holds :data:`CAPPED_SECONDS` of them
    (else empty): a shaper holds a connection down in every second it lasts; a share the
    fabric model misjudges (a collision it does not see, TCP's unequal shares) dips under
    the line in a few seconds scattered over the run. A connection whose share the model
    misjudges all along and that a slow link then held down shows both: the run is the
    slow link's."""
    seconds = sorted(set(busy))
    low = sorted(low)
    best: list[int] = []
    for a, first in enumerate(low):
        for b in range(len(low) - 1, a + CAPPED_SECONDS - 2, -1):
            if b - a + 1 <= len(best):
                break
            between = sum(1 for s in seconds if first <= s <= low[b])
            if b - a + 1 >= LOW_DENSITY * between:
                best = low[a : b + 1]
                break
    return best


def _held_seconds(shares: dict[int, dict[int, float]], slow: Iterable[int]) -> set[int]:
    """The seconds in which some of the ``slow`` connections sent under
    :data:`SENDING_SHARE` of their fair share (:func:`pace_shares`)."""
    return {
        second
        for cid in slow
        for second, share in shares.get(cid, {}).items()
        if share < SENDING_SHARE
    }


def held_window(
    conns: Sequence[ConnectionView], capacity: dict[str, float], slow: Iterable[int]
) -> tuple[float, float] | None:
    """From the first second the ``slow`` connections were held under their share to the
    end of the last one (None when their shares are not known)."""
    return _window(pace_shares(conns, capacity), slow)


def _window(shares: dict[int, dict[int, float]], slow: Iterable[int]) -> tuple[float, float] | None:
    seconds = _held_seconds(shares, slow)
    return (float(min(seconds)), float(max(seconds)) + 1.0) if seconds else None


def kept_share(
    conns: Sequence[ConnectionView], capacity: dict[str, float], slow: Iterable[int]
) -> set[int] | None:
    """The connections that kept their fair share while the ``slow`` ones were held under
    theirs: in the seconds some slow connection sent under :data:`SENDING_SHARE`, their
    median share was :data:`KEPT_SHARE` or more. Only these contradict a slow link on
    their path: a connection that crossed it after the fault ended, or crossed it paced
    low too (a link slowed to a quarter holds every connection on it to 0.2-0.6 of its
    share, only some under the line), says nothing against it. None when the shares are
    not known (a path known only in part)."""
    return _kept(pace_shares(conns, capacity), slow)


def _kept(shares: dict[int, dict[int, float]], slow: Iterable[int]) -> set[int] | None:
    slow = set(slow)
    window = _held_seconds(shares, slow)
    if not window:
        return None
    kept = set()
    for cid, mine in shares.items():
        during = [share for second, share in mine.items() if second in window]
        if cid not in slow and during and statistics.median(during) >= KEPT_SHARE:
            kept.add(cid)
    return kept


def _fair_shares(busy: Sequence[ConnectionView], capacity: dict[str, float]) -> dict[int, float]:
    """Each busy connection's fair share of its path (bytes/s; see :func:`capped`). Where
    ``capacity`` has a direction's parallel links apart (:func:`lane_capacity`), each of
    them is shared by the connections that cross it alone: a connection on a crowded one
    of four gets less than one on an idle one, without any fault."""
    crossing: dict[str, int] = defaultdict(int)
    ways = {c.id: _ways(c, capacity) for c in busy}
    for c in busy:
        for d in ways[c.id]:
            crossing[d] += 1
    out = {}
    for c in busy:
        shares = [capacity[d] / crossing[d] for d in ways[c.id] if d in capacity]
        out[c.id] = min(shares) if shares else math.inf
    return out


def _ways(c: ConnectionView, capacity: Mapping[str, float]) -> list[str]:
    """``c``'s directions, each as its lane (``A>B#P``) where ``capacity`` has lanes."""
    return [
        lane if lane in capacity else name
        for name, lane in zip(c.directions(), c.lanes(), strict=True)
    ]


def lane_capacity(obs: Observations) -> dict[str, float]:
    """Each direction's rate by its name, and where two nodes are joined by parallel
    links, each of them apart too, as ``A>B#P`` (P: the port it leaves A by)."""
    out = {name: d.capacity_bps for name, d in obs.directions.items()}
    for name, d in obs.directions.items():
        ports = egress_ports(obs, d)
        if len(ports) > 1:
            for _, port in ports:
                out[f"{name}#{port}"] = d.capacity_bps
    return out


def connection_faults(obs: Observations) -> list[Suspect]:
    span = obs.span
    conns = [c for c in obs.connections if c.samples]
    if span is None or not conns:
        return []
    start, end = span
    by_id = {c.id: c for c in conns}
    capacity = lane_capacity(obs)
    rates = capped(conns, capacity)
    shares = pace_shares(conns, capacity)  # once: the pace rule, the window and who kept up
    paced = _held_below(shares)
    if len(paced) > GLOBAL_SHARE * len(conns) and not _through_full_queue(obs, paced, by_id):
        # most connections paced low at once: a pipelined collective (a ring forwards as
        # it receives) sends at its slowest link's pace everywhere; the peaks must tell
        paced = {}
    # A connection held under its share second after second crosses a slow link; the
    # tail drops of the slow link's full queue time it out now and then (an all-to-all's
    # connections stall 1-4 s so), which makes it no hole: it is slow, not stalled.
    held = set(rates) | set(paced)
    stalled = {c.id: s for c in conns if c.id not in held and (s := stalls(c, obs.now))}
    retrans = {c.id: retransmissions(c, start, end) for c in conns}
    typical = statistics.median(retrans.values()) if retrans else 0
    # A connection dropped into a hole keeps retransmitting into it; the collective's
    # other connections then stall behind it with nothing retransmitted (their receivers
    # wait for the dropped data first): those are its consequence, not more evidence.
    dropped = {
        cid: s for cid, s in stalled.items()
        if retrans[cid] >= max(HOLE_RETRANS_MIN, RETRANS_FACTOR * typical)
    }  # fmt: skip
    stalled = dropped or stalled
    # Connections in a hole retransmit into it while they stall; those that retransmitted
    # elsewhere in the run (congestion) and stalled only waiting for them did not
    # retransmit across their stall: when some did, they are the evidence.
    holes = {
        cid: s for cid, s in stalled.items()
        if retransmitted_in_longest(by_id[cid], s) >= HOLE_RETRANS_MIN
    }  # fmt: skip
    holes = _first_stalled(holes)
    if obs.now is not None and not obs.queues:
        # live, where no queue says whether a switch's drops were congestion's: a
        # congested all-to-all's timeouts stall connections 1-1.5 s with retransmissions
        # (a healthy run alerted on a "hole" so), a hole holds them until it ends
        stalled = {
            cid: s for cid, s in stalled.items() if max(b - a for a, b in s) >= HOLE_S
        }  # fmt: skip
        holes = {cid: s for cid, s in holes.items() if cid in stalled}
    if len(stalled) > GLOBAL_SHARE * len(conns):
        # Most connections stalled at once: the whole fabric's load (a congested
        # all-to-all's timeouts), the machine, or a collective waiting behind a few
        # connections in a hole. Those few retransmit into it while they stall; the
        # others wait with nothing to retransmit.
        stalled = holes if len(holes) <= GLOBAL_SHARE * len(conns) else {}
    elif holes and dropped:
        stalled = holes
    # a connection a server-mate forwards (rail-only) crossed NVLink and the mate's kernel
    # first, which lose uncounted under load (uncounted_losses): its retransmissions
    # alone name no link of the fabric
    lossy = {
        cid for cid, n in retrans.items()
        if n >= max(RETRANS_MIN, RETRANS_FACTOR * typical) and not _forwarded(obs, by_id[cid])
    } - set(stalled)  # fmt: skip
    # a peak rate held down second after second is a shaper's: a slow link, even when
    # the sender overflowed its queue and retransmitted (a lossy link at full rate
    # loses in bursts between which its sender runs at the link's pace)
    slow = (set(rates) | set(paced)) - set(stalled)
    lossy -= slow
    # most connections at once: the machine (a busy neighbour, the emulator's CPU) or the
    # whole fabric's load, not one component; no link is blamed for it
    anomalous = set(stalled) | lossy | slow
    if len(anomalous) > GLOBAL_SHARE * len(conns) and not (
        anomalous == slow and _through_full_queue(obs, slow, by_id)
    ):
        return []
    out: list[Suspect] = []
    if stalled:
        out += _explain_stalls(obs, [by_id[i] for i in stalled], conns, stalled)
    if lossy:
        why = {i: f"{retrans[i]} retransmitted segments" for i in lossy}
        note = f"the median connection retransmitted {typical:g}"
        bad = [by_id[i] for i in lossy]
        onsets = {c.id: _first_retransmission(c, start) for c in bad}
        out += _explain(
            obs, bad, conns, "lossy", why, typical_note=note, onsets=onsets,
            leaks=switch_leaks(obs),
        )  # fmt: skip
    if slow:
        why = {
            i: f"sent at most {rates[i][0]:.0%} of the typical connection's rate, in "
            f"{rates[i][1]} of its busy seconds"
            if i in rates
            else f"sent at {paced[i][0]:.0%} of its fair share of its path or less while "
            f"sending, in {paced[i][1]} seconds"
            for i in slow
        }
        onsets = {i: (rates.get(i) or paced[i])[2] for i in slow}
        # where a queue says which direction is slow: full while they were held (a
        # port that is the bottleneck the rest of the time fills only then)
        window = _window(shares, slow)
        if window is None and (held_at := [rates[i] for i in slow if i in rates]):
            window = (min(r[2] for r in held_at), max(r[3] for r in held_at))
        out += _explain(
            obs, [by_id[i] for i in slow], conns, "slow", why, onsets=onsets,
            queues=switch_queues(obs), kept=_kept(shares, slow), window=window,
        )  # fmt: skip
    return out


def _through_full_queue(
    obs: Observations, ids: Iterable[int], by_id: dict[int, ConnectionView]
) -> bool:
    """Whether every one of the connections ``ids`` crosses one direction whose egress
    queue was full (:func:`full_queues`): most connections held low at once is the
    machine or a pipelined collective, unless they all wait at one port that could not
    keep up. A small fabric (one spine) sends every connection that leaves a leaf through
    the same link: a slow one holds them all."""
    common: set[str] | None = None
    for cid in ids:
        mine = set(by_id[cid].directions())
        common = mine if common is None else common & mine
    if not common or not obs.queues:
        return False
    full = full_queues(obs)
    return any(
        port in full
        for name in common
        if name in obs.directions
        for port in egress_ports(obs, obs.directions[name])
    )


def silent_onset(obs: Observations, switch: str) -> float | None:
    """When ``switch`` began dropping what no full queue explains: the first of its queue
    samples from which on its drops beyond the queues' discards stay at
    :data:`SILENT_MIN_PACKETS` or more (packets crossing the switch at a sample count as
    received and not yet sent for a moment; a drop stays counted). Each queue sample is
    read against the port counters at or before it, so a counter that lags undercounts the
    drops: late rather than early. None without queue samples or before the run's span."""
    span = obs.span
    ports = sorted(port for sw, port in obs.counters if sw == switch)
    if span is None or not ports or any((switch, port) not in obs.queues for port in ports):
        return None
    first = min((c.samples[0][0] for c in obs.connections if c.samples), default=span[0])
    start = min(span[0], first) - 0.5
    times = sorted({r[0] for port in ports for r in obs.queues[(switch, port)]})
    onset = None
    for t in times:
        if t < span[0] - 1.0:
            continue
        packets = 0
        for port in ports:
            a, b = obs.counter_at((switch, port), start), obs.counter_at((switch, port), t)
            if a is None or b is None:
                return None
            packets += (b[3] - a[3]) - (b[4] - a[4])
        packets -= sum(obs.queue_drops((switch, port), start, t) or 0 for port in ports)
        packets -= sum(obs.ingress_drops((switch, port), start, t) for port in ports)
        if packets < SILENT_MIN_PACKETS:
            onset = None
        elif onset is None:
            onset = t
    return onset


def dropped_without_congestion(obs: Observations) -> list[Suspect]:
    """Switches that dropped packets no full queue of theirs explains (:func:`switch_leaks`
    with the queues' counters) while every connection through them kept moving: a lossy
    egress of that switch (a connection stalled there for :data:`HOLE_S` or more is a
    blackhole's, which :func:`connection_faults` explains). Which egress: the one whose
    connections retransmitted most beyond the run's median connection, each direction
    scored by its share of that excess over the switch's egresses. This needs no
    connection to stand out against the whole run (an all-to-all's congestion makes every
    connection retransmit): the counters have already said where the loss is, the
    retransmissions only choose among one switch's ports. Drops of acknowledgements
    only (:data:`ACK_BYTES`) cost no sender anything and name nothing. Without queue
    samples a switch's drops cannot be told from congestion's, and this says nothing.
    Live, the queue samples so far, and :func:`switch_leaks`' allowance for them."""
    span = obs.span
    conns = [c for c in obs.connections if c.samples]
    live = reads_live(obs)
    leaks = switch_leaks(obs)  # before the live queues stand in: it knows the cut is live
    obs = _with_live_queues(obs)
    if span is None or not obs.queues or not conns:
        return []
    start, end = span
    retrans = {c.id: retransmissions(c, start, end) for c in conns}
    typical = statistics.median(retrans.values())
    out: list[Suspect] = []
    leaking, dropping, acks_only = {}, {}, {}
    for switch, leak in leaks.items():
        if leak.silent_acknowledgements():
            acks_only[switch] = leak  # only the other end of a lossy link may count them
            continue  # acknowledgements only: nothing a sender waits for was lost
        through_switch = [c for c in conns if switch in c.switches()]
        dropping[switch] = leak
        if any(b - a >= HOLE_S for c in through_switch for a, b in stalls(c, obs.now)):
            continue  # a hole: the stalls name it
        leaking[switch] = leak
    # a hole drops at one switch; both ends of one link dropping is a loss on it, however
    # long its timeouts stalled the connections through it
    out += _lossy_between(obs, dropping, conns, leaks, acks_only)
    for switch, leak in leaking.items():
        # every switch dropping about as much, none of it much: congestion's or the
        # emulator's own (a healthy ECMP ring on an oversubscribed fat-tree: 7 to 14
        # packets at four switches), not one lossy egress to choose. The others' drops
        # count whatever they were: the emulator drops acknowledgements and data alike
        # (a healthy ring on astral-small, 2026-12-04: 6 to 9 packets at eight ToRs, at
        # seven of them acknowledgements only, 9 with data at the eighth)
        if about_as_much(leak.silent, [x.silent for sw, x in leaks.items() if sw != switch]):
            continue
        if about_as_often(leak, [x for sw, x in leaks.items() if sw != switch]):
            continue
        if not _leaks_alone(leak):
            continue
        if live and leak.silent < LIVE_OVER_QUEUED * (leak.queued or 0):
            continue
        rows = []
        # mostly acknowledgements (at least ACK_WAY of the packets, counting every byte
        # as a whole data segment's): the lost egress is on the connections' way back,
        # the link's other end dropping their data (seed 24: a core 31 packets short,
        # 7,910 bytes, blamed on the egress its lossy connections' data left by, where
        # their lossy link went in)
        acks = (leak.packets - leak.nbytes / DATA_BYTES) / max(1, leak.packets)
        back = acks >= ACK_WAY and not leak.queued
        for d in obs.directions.values():
            if d.src != switch:
                continue
            way = f"{d.dst}>{d.src}" if back else d.name
            through = [c for c in conns if way in c.directions()]
            if through:
                excess = sum(max(0, retrans[c.id] - typical) for c in through) / len(through)
                # an egress whose own queue discarded packets owes its connections'
                # retransmissions to that, in the measure its discards outnumber the
                # switch's unexplained drops: the loss is more likely where none were
                discarded = sum(
                    obs.queue_drops(port, start - 0.5, end + 1.0) or 0
                    for port in egress_ports(obs, d)
                )
                purity = leak.silent / max(1, leak.silent + discarded)
                rows.append((excess * purity, excess, purity, d, through))
        total = sum(row[0] for row in rows)
        if total <= 0:
            continue
        rows.sort(key=lambda row: (-row[0], row[3].name))
        began = silent_onset(obs, switch)
        for weighted, excess, purity, d, through in rows[:3]:
            if weighted <= 0:
                break
            share = weighted / total
            firsts = [_first_retransmission(c, start) for c in through]
            onset = began or min((t for t in firsts if t is not None), default=None)
            evidence = [
                leak.describe(switch),
                f"transport: the {len(through)} connection(s) "
                + (f"acknowledged through {d.name}" if back else f"through {d.name}")
                + f" retransmitted {excess:.0f} segments each beyond the median connection's "
                f"{typical:g}: {share:.0%} of that excess over {switch}'s {len(rows)} "
                "egresses in use",
            ]
            if back:
                evidence.append(
                    f"counters: at least {acks:.0%} of {switch}'s drops were acknowledgements "
                    f"({leak.nbytes:,} bytes in {leak.packets} packets): the egress of the "
                    "connections' way back"
                )
            # below a link seen down (0.8: reconcile's line), whose port drops what it
            # would send as well; drops beside many more this egress's full queue
            # discarded are less sure than drops at an egress without congestion
            score = 0.79 * share * (0.5 + 0.5 * purity)
            # a share of next to nothing says nothing: a lost data packet costs its
            # connection tens of segments (a 64 KiB one, 45)
            score *= min(1.0, excess / LOSS_EXCESS)

            out.append(Suspect("link", d.name, "lossy", score, evidence, onset))
    return out


def _leaks_alone(leak: Leak) -> bool:
    """Whether a switch's unexplained drops are enough to name a lossy egress by:
    :data:`LOSSY_SILENT_MIN` packets or more, and :data:`LOSSY_OVER_QUEUED` of what its
    full queues discarded. The queues and the ports are sampled apart, and healthy runs
    leave switches 6 to 54 packets short beside their queues' discards (the suites of
    seeds 20-22: 26 beside 116, 12 beside 70, 6 beside 7 called lossy at 0.52-0.79); the
    losses the suites injected left 31 to 67 at the faulty link's switch, beside at most
    1.5 times as many discards. A blackhole's fewer drops (12-15 packets for one
    connection) are the stall rules' evidence, which do not ask this."""
    return leak.silent >= max(LOSSY_SILENT_MIN, LOSSY_OVER_QUEUED * (leak.queued or 0))


def _lossy_between(
    obs: Observations,
    leaking: dict[str, Leak],
    conns: Sequence[ConnectionView],
    all_leaks: dict[str, Leak],
    acks_only: dict[str, Leak] | None = None,
) -> list[Suspect]:
    """Links whose two ends both dropped packets no full queue explains, and which some
    connection crossed: a loss on the link both ways drops at each end's egress, and each
    end's counters say so whatever the congestion around it makes the retransmissions say
    (an all-to-all under ECMP: every connection retransmits 40-180 segments). Healthy
    switches leave at most 4 packets unexplained; a hole or a down link drops at one end
    (a down link's ends are named by their port events, above this score). An end that
    dropped about as much as every other switch (:func:`about_as_much`, against
    ``all_leaks``) makes the link less likely: the whole fabric dropped so. An end that
    dropped acknowledgements only (``acks_only``) counts when the other end dropped data
    and connections' data crossed the link towards it: their acknowledgements come back
    by its egress (a ring crossing a link one way loses data at one end and
    acknowledgements at the other; seed 25: 106 and 83 packets, the link called healthy)."""
    out = []
    towards = {d for c in conns for d in c.directions()}  # data crossed it this way
    crossed = {obs.directions[d].link_name for d in towards if d in obs.directions}
    acks_only = acks_only or {}
    span = obs.span
    assert span is not None
    retrans = {c.id: retransmissions(c, *span) for c in conns}
    typical = statistics.median(retrans.values()) if retrans else 0
    for name, ends in _link_directions(obs).items():
        nodes = {d.src for d in ends}
        if name not in crossed or len(nodes) != 2:
            continue
        acked = [
            d.dst for d in ends
            if d.src in leaking and d.dst in acks_only and d.name in towards
        ]  # fmt: skip
        if not nodes <= set(leaking) | set(acked):
            continue
        leaks = [(node, leaking.get(node) or acks_only[node]) for node in sorted(nodes)]
        # what the link's own egress queues discarded (congestion on it), not the rest
        # of the two switches' discards, makes its ends' unexplained drops less sure
        discarded = sum(
            obs.queue_drops(port, span[0] - 0.5, span[1] + 1.0) or 0
            for d in ends
            for port in egress_ports(obs, d)
        )
        silent = sum(leak.silent for _, leak in leaks)
        purity = silent / max(1, silent + discarded)
        # ... unless each end's unexplained drops are many on their own: healthy switches
        # leave at most 4, and the queues' jitter grows with their discards, not this far
        purity = max(purity, min(1.0, min(leak.silent for _, leak in leaks) / BOTH_ENDS_SURE))
        began = [t for node, _ in leaks if (t := silent_onset(obs, node)) is not None]
        evidence = [leak.describe(node) for node, leak in leaks]
        evidence.append(
            f"paths: {name} joins the two: a loss on it both ways drops at each end's egress"
        )
        evidence += [
            f"counters: {node}'s drops were acknowledgements (under {ACK_BYTES} bytes a "
            "packet), of the connections whose data crossed the link towards it"
            for node in acked
        ]
        score = 0.79 * (0.5 + 0.5 * purity)
        # ends that each left no more unexplained than healthy switches do (up to 18
        # packets in a healthy run) need the transport to agree: the connections across
        # the link retransmitted beyond the run's median (seed 10: a healthy ECMP ring
        # left 5 and 7 at the two ends of one link; seed 8's loss, 7 and 9, and its one
        # connection across retransmitted 32 segments beyond the median's 2.5, 14 times)
        weakest = min(leak.silent for _, leak in leaks)
        if weakest < BOTH_ENDS_MIN:
            across = [c for c in conns if {d.name for d in ends} & set(c.directions())]
            most = max((retrans[c.id] for c in across), default=0)
            # beyond the median by as much as a loss's, and by a factor a busy run's
            # spread does not reach (seed 22, healthy: 7 and 12 at a link's ends, its
            # one connection 50 segments against the median's 19, called lossy at 0.79)
            if most - typical < LOSS_EXCESS or most < RETRANS_FACTOR * typical:
                score *= weakest / BOTH_ENDS_MIN
                evidence.append(
                    f"but each end's drops ({weakest} packets at the fewer) are as few as a "
                    "healthy switch leaves, and no connection across retransmitted beyond "
                    "the others"
                )
        # an end dropping no more than the other switches do is the fabric's noise, not
        # half of a loss both ends show; the others count whatever they dropped (a
        # healthy pinned all-to-all on a rail-optimized fabric, 2026-12-04: 7 and 21 at a
        # leaf-spine link's ends, 7 to 16 at five other switches, two of them
        # acknowledgements only, called lossy at 0.73 when the stronger end was weighed
        # against the switches that dropped data)
        others = [x.silent for sw, x in all_leaks.items() if sw not in nodes]
        if about_as_much(weakest, others):
            score *= 0.4
            evidence.append(
                f"but {len(others)} other switches dropped about as much (median "
                f"{statistics.median(others):.0f} packets): congestion"
            )
        out.append(Suspect("link", name, "lossy", score, evidence, min(began, default=None)))
    return out


def about_as_much(silent: int, others: Sequence[int]) -> bool:
    """Whether ``silent`` unexplained drops are no more than twice the median of two or
    more other switches': drops that every switch shows are congestion's or the
    emulator's own, not one lossy egress (healthy runs on fabrics of 16-26 switches left
    6 to 16 at several switches at once)."""
    return len(others) >= 2 and silent <= 2 * statistics.median(others)


def about_as_often(leak: Leak, others: Sequence[Leak]) -> bool:
    """Whether ``leak``'s unexplained drops are, per packet its switch received, no more
    than twice the median of :data:`BACKGROUND_SWITCHES` or more other switches' that
    dropped some too: the emulator dropping packets everywhere in proportion to what each
    switch carries, not one lossy egress. A congested switch handles more packets and
    loses more of them that way than a quiet one, which :func:`about_as_much` (counts)
    misreads: seed 50 run 6, a healthy ECMP all-to-all, left 15 switches 6 to 30 packets
    short, 4 to 15 per 10,000 received, and its busiest ToR's 22 (12 per 10,000) read as
    a lossy uplink. The losses of nine saved suites left their switch 4 to 75 per 10,000;
    where six other switches or more dropped some too (two runs), 12 and 13 times as
    often as their median."""
    rates = [x.silent / x.received for x in others if x.silent > 0 and x.received > 0]
    if len(rates) < BACKGROUND_SWITCHES or leak.received <= 0:
        return False
    return leak.silent / leak.received <= 2 * statistics.median(rates)


def _forwarded(obs: Observations, c: ConnectionView) -> bool:
    """Whether a server-mate forwards ``c`` (a rail-only fabric's cross-rail connection):
    before its first switch it crosses NVLink and the mate's kernel, which lose packets
    no counter sees under load (healthy runs' NVLink connections retransmitted up to 185
    segments in the saved suites); so its losses name no link of its recorded path (seed
    62 run 27, a healthy rail-only ring: one forwarded connection retransmitted 46, the
    median 0, called the mate's NIC link lossy at 0.98)."""
    gpus = obs.fabric.gpus
    if not obs.fabric.gpu_forwarding or c.src_gpu not in gpus or c.dst_gpu not in gpus:
        return False
    return obs.fabric.wire_source(c.src_gpu, c.dst_gpu) != c.src_gpu


def uncounted_losses(obs: Observations) -> list[Suspect]:
    """Retransmissions no counter explains, gathered on the link out of one GPU: a loss
    there. Every other place a packet can be lost is counted somewhere: a switch's full
    egress queue reports its discards (:attr:`Observations.queues`), and whatever else a
    switch drops shows in its ports' counters (:func:`switch_leaks`). A packet lost on
    its way out of a GPU never reaches a switch, so no counter sees it; its sender
    retransmits it. So per connection, the segments it retransmitted while no egress queue
    on its path discarded anything (within :data:`UNCOUNTED_PAD_S`, the time a loss
    takes to be retransmitted), outside its stalls (a hole's or a down link's timeouts,
    which their own detectors read), and on no leaking switch's path; summed per link
    out of a GPU (every connection's first hop). Congestion's drops hide a loss behind
    them (a connection through a discarding queue is explained while it discards), so
    only the connections on quiet paths speak; they do not have to be many, but each must
    have retransmitted so over :data:`UNCOUNTED_SPREAD_S` or more. Scored by
    the share of the run's unexplained retransmissions on that link (healthy runs:
    up to 29 in all, at most 6 on one link, over 50 runs of the diagnosis suite) and
    by their number against :data:`UNCOUNTED_SURE`. A link or switch that went down also
    loses packets no counter reports; its port events name it, and the reconciliation
    ranks what followed it below it (diagnose.reconcile). Live, the queues' samples so
    far stand in, and the last :data:`UNCOUNTED_LIVE_LAG_S` of retransmissions wait for
    the samples that may explain them."""
    span = obs.span
    live = reads_live(obs)
    if span is None or not (obs.queues or live):
        return []  # without the queues' discards, congestion's losses are not told apart
    leaking = set(switch_leaks(obs))  # before the live queues stand in: it reads the cut
    # live, a discard after the queues' last sample is not known yet, and its
    # retransmissions would read as lost out of the GPU: those waiting on it are left
    # to a later look (a look every second; the queues are sampled every 0.5 s)
    horizon = obs.now - UNCOUNTED_LIVE_LAG_S if live and obs.now is not None else math.inf
    obs = _with_live_queues(obs)
    discards = discarding(obs)
    unexplained: dict[str, int] = defaultdict(int)
    onset: dict[str, float] = {}
    whose: dict[str, list[tuple[ConnectionView, int]]] = defaultdict(list)
    for c in obs.connections:
        if len(c.path) < 2 or leaking & set(c.switches()):
            continue
        if _forwarded(obs, c):
            continue
        ports = [(h.node, h.out_port) for h in c.path[1:] if h.out_port is not None]
        quiet = [iv for port in ports for iv in discards.get(port, [])] + stalls(c, obs.now)
        count, first, last = 0, None, None
        for (t0, r0), (t1, r1) in itertools.pairwise(c.retrans):
            if t1 > horizon:
                break
            if r1 > r0 and not any(a <= t1 and t0 <= b for a, b in quiet):
                count += r1 - r0
                first = t1 if first is None else first
                last = t1
        if first is not None and last is not None and last - first < UNCOUNTED_SPREAD_S:
            continue  # one burst: a timeout that resent its window, lost anywhere
        if count:
            name = c.directions()[0]
            unexplained[name] += count
            whose[name].append((c, count))
            if first is not None:
                onset[name] = min(onset.get(name, first), first)
    total = sum(unexplained.values())
    out = []
    for name, count in unexplained.items():
        if count < UNCOUNTED_MIN or name not in obs.directions:
            continue
        purity = count / total
        shown = sorted(whose[name], key=lambda cn: -cn[1])[:3]
        listed = ", ".join(f"{_describe(obs, c)}: {n}" for c, n in shown)
        evidence = [
            f"transport: the connections leaving by {name} retransmitted {count} segments "
            f"while no egress queue on their paths discarded anything and no switch on "
            f"them dropped packets ({listed}); {total - count} such segments on every "
            "other link out of a GPU",
            f"paths: {name} is their first hop, out of the GPU, where no switch counts "
            "what is lost",
        ]
        score = 0.85 * purity * min(1.0, count / UNCOUNTED_SURE)
        out.append(Suspect("link", name, "lossy", score, evidence, onset.get(name), {UNCOUNTED}))
    return out


def overfull_queues(obs: Observations) -> list[Suspect]:
    """A switch port whose egress queue filled although what could reach it could not
    outrun it: that port sends slower than its link's rate (``slow``). A queue builds
    only where packets arrive faster than the port sends them; the connections crossing
    it arrive at most at their paths' rates before it (each at its narrowest direction
    upstream, one such direction feeding several connections counted once). When those
    rates together do not exceed the port's own, a full queue (:data:`QUEUE_MIN_BYTES`
    held in :data:`OVERFULL_SAMPLES` consecutive samples or more, :data:`OVERFULL_BYTES`
    in :data:`OVERFULL_PEAKS` of them) says the port is slower than its
    link should be. Congestion cannot look like it: an incast or a collision is more
    arriving than the port's rate. This reads a slow link under a collective whose other
    connections wait for the slow one (a ring), where the slow connection's own pace,
    against the share its waiting neighbours leave it, looks healthy.

    One slow port is a link's fault; several at once are not (:func:`_standing_elsewhere`:
    the score is halved)."""
    span = obs.span
    queues = slow_port_queues(obs)
    if span is None or not queues:
        return []
    start, end = span[0] - 0.5, span[1] + 1.0
    direction_of = {port: d for d in obs.directions.values() for port in egress_ports(obs, d)}
    standing = _standing_queues(obs, queues, direction_of, start, end)
    out: dict[str, Suspect] = {}
    for port, (full, sent) in sorted(standing.items()):
        d = direction_of[port]
        held = sorted(r[3] for r in full)[len(full) // 2]
        a, b = full[0][0], full[-1][0]
        arriving = _arriving(obs, d, a, b)
        if arriving is None:
            continue
        through, feeds, offered = arriving
        if offered > d.capacity_bps * OVERFULL_MARGIN:
            continue  # more could arrive than it sends at its rate: congestion's queue
        if sent is None and obs.now is not None:
            continue  # live, the counters' last poll before the queue's: not confirmed yet
        if sent is not None and sent >= OVERFULL_SENT:
            # it sent at its rate meanwhile: not slow, the bottleneck of a chain of equal
            # rates whose shaper runs a little slower than the one before it (seed 10: a
            # 4 Mbit/s core port behind a 4 Mbit/s uplink held 50-80 KB for a minute while
            # sending at 0.96 of its rate)
            continue
        evidence = [
            f"counters: {port[0]}'s egress to {d.dst} held {held:,} bytes (median of "
            f"{len(full)} samples from {rel(obs, a)} to {rel(obs, b)})",
            f"paths: only {len(through)} connection(s) crossed it then, arriving at most at "
            f"{offered / 1e6:.1f} Mbit/s together (their narrowest links before it: "
            f"{', '.join(sorted(feeds))}), its rate "
            f"{d.capacity_bps / 1e6:.1f} Mbit/s: it sent slower than its link's rate",
        ]
        score = OVERFULL_SCORE
        others = _standing_elsewhere(standing, direction_of, port, a, b)
        if others:
            score *= 0.5
            evidence.append(
                f"but {len(others)} other port(s) held a queue while sending under "
                f"{OVERFULL_ELSEWHERE_SENT:.0%} of their rate meanwhile ("
                + ", ".join(others[:3])
                + (" ..." if len(others) > 3 else "")
                + "): the fabric, not one link"
            )
        _keep_earliest(out, Suspect("link", d.name, "slow", score, evidence, a))
    return list(out.values())


def held_below_half(obs: Observations) -> list[Suspect]:
    """A switch port that held a backlog from one sample to the next for
    :data:`HALF_INTERVALS` intervals in a row and sent at most :data:`HALF_MAX` of its
    rate in every one of them (:data:`HALF_MEDIAN` at the median), while what could reach
    it (its connections' narrowest links before it) was no faster than its rate: it is
    shaped to about half (``slow``).

    Why: a port slowed to half under one connection sends at 0.46-0.51 of its rate with
    its queue never empty, and :func:`overfull_queues` and :func:`sending_below_rate`
    look for less (a quarter-rate port sends 0.18-0.27; healthy ports with a burst queued
    at two instants sent 0.34-1.0 between them) and for more bytes held than a 16-frame
    queue holds (24 kB and 40 kB: the least queue any port has; seed 68 run 1, a fat-tree
    uplink at half its 10 Mbit/s under a pinned ring, held 8-27 kB at 9 samples in a row
    while it sent 0.36-0.51, and 0.94-0.98 with a queue before the fault). The backlog
    counts from a quarter of the port's queue (:data:`HALF_QUEUE_SHARE` of 10 ms of its
    rate, 16 full frames at least: :data:`QUEUE_S`, :data:`QUEUE_MIN_FRAMES`). Over the saved
    suites of seeds 65-68 (192 runs, 64 healthy), the ports held so for 6 intervals at
    a median of 0.55 or less were the slowed links' (0.1, 0.25, 0.48 and 0.48), and one
    healthy spine port under an ECMP all-to-all (0.51, more arriving than its rate). A
    port that can be offered more than its rate is congestion's, whatever it sent; several
    ports held so at once (each under 0.75 of its rate at the median) are the fabric's, not
    one link's (:func:`overfull_queues` halves its own reading then, and says so)."""
    span = obs.span
    queues = slow_port_queues(obs)
    if span is None or not queues or not obs.counters:
        return []
    direction_of = {port: d for d in obs.directions.values() for port in egress_ports(obs, d)}
    held: dict[Port, list[tuple[float, float, float]]] = {}
    for port, rows in sorted(queues.items()):
        d = direction_of.get(port)
        if d is None:
            continue
        rows = [r for r in rows if span[0] - 0.5 <= r[0] <= span[1] + 1.0]
        stretch = _held_stretch(obs, port, d, rows, _half_backlog(d))
        if len(stretch) >= HALF_INTERVALS:
            held[port] = stretch
    out: dict[str, Suspect] = {}
    for port, stretch in held.items():
        d = direction_of[port]
        backlog = _half_backlog(d)
        paces = [pace for _, _, pace in stretch]
        if max(paces) > HALF_MAX or statistics.median(paces) > HALF_MEDIAN:
            continue
        a, b = stretch[0][0], stretch[-1][1]
        if any(
            statistics.median(x for _, _, x in other) < OVERFULL_ELSEWHERE_SENT
            and other[0][0] <= b
            and a <= other[-1][1]
            for p, other in held.items()
            if direction_of[p].name != d.name
        ):
            continue  # several ports so at once: the fabric's (overfull_queues says so)
        arriving = _arriving(obs, d, a, b)
        if arriving is None:
            continue
        through, feeds, offered = arriving
        if offered > d.capacity_bps * OVERFULL_MARGIN:
            continue  # more could arrive than it sends at its rate: congestion's queue
        evidence = [
            f"counters: {port[0]}'s egress to {d.dst} held {backlog / 1e3:.0f} kB or more "
            f"at both ends of {len(stretch)} sampling intervals in a row from {rel(obs, a)} "
            f"to {rel(obs, b)}, and sent {min(paces):.2f}-{max(paces):.2f} of its rate "
            f"(median {statistics.median(paces):.2f}): a port with work waiting sends at its "
            "rate",
            f"paths: only {len(through)} connection(s) crossed it then, arriving at most at "
            f"{offered / 1e6:.1f} Mbit/s together (their narrowest links before it: "
            f"{', '.join(sorted(feeds))}), its rate "
            f"{d.capacity_bps / 1e6:.1f} Mbit/s: not congestion's queue",
        ]
        _keep_earliest(out, Suspect("link", d.name, "slow", HALF_SCORE, evidence, a))
    return list(out.values())


def _half_backlog(d: Direction) -> float:
    """:data:`HALF_QUEUE_SHARE` of the queue of ``d``'s port, in bytes."""
    return HALF_QUEUE_SHARE * max(d.capacity_bps / 8 * QUEUE_S, QUEUE_MIN_FRAMES * FRAME_BYTES)


def _held_stretch(
    obs: Observations,
    port: Port,
    d: Direction,
    rows: Sequence[tuple[float, int, int, int]],
    backlog: float,
) -> list[tuple[float, float, float]]:
    """The longest run of consecutive sampling intervals whose both ends found ``backlog``
    bytes or more in the queue, each as (start, end, what the port sent over it as a share
    of its rate); an interval the counters do not cover ends a run."""
    best: list[tuple[float, float, float]] = []
    run: list[tuple[float, float, float]] = []
    for x, y in itertools.pairwise(rows):
        sent = _sent_bytes(obs, port, x[0], y[0]) if y[0] > x[0] else None
        if x[3] >= backlog and y[3] >= backlog and sent is not None:
            run.append((x[0], y[0], sent * 8 / (y[0] - x[0]) / d.capacity_bps))
            if len(run) > len(best):
                best = list(run)
        else:
            run = []
    return best


def _standing_queues(
    obs: Observations,
    queues: Mapping[Port, Sequence[tuple[float, int, int, int]]],
    direction_of: Mapping[Port, Direction],
    start: float,
    end: float,
) -> dict[Port, tuple[list[tuple[float, int, int, int]], float | None]]:
    """Every port of a known direction whose egress held a standing queue (the full run
    :func:`overfull_queues` reads), with the run's samples and what the port sent
    meanwhile as a share of its rate (None where the counters do not cover it)."""
    out = {}
    for port, rows in queues.items():
        d = direction_of.get(port)
        full = _longest_full_run([r for r in rows if start <= r[0] <= end])
        peaks = sum(1 for r in full if r[3] >= OVERFULL_BYTES)
        if d is None or len(full) < OVERFULL_SAMPLES or peaks < OVERFULL_PEAKS:
            continue
        a, b = full[0][0], full[-1][0]
        sent = _sent_bytes(obs, port, a, b) if b > a else None
        out[port] = (full, None if sent is None else sent * 8 / (b - a) / d.capacity_bps)
    return out


def _standing_elsewhere(
    standing: Mapping[Port, tuple[list[tuple[float, int, int, int]], float | None]],
    direction_of: Mapping[Port, Direction],
    port: Port,
    start: float,
    end: float,
) -> list[str]:
    """The other directions whose ports held a standing queue while sending under
    :data:`OVERFULL_ELSEWHERE_SENT` of their rate at some time between ``start`` and
    ``end``. A slowed link's port does that alone; ports across the fabric doing it at
    once are not each a slowed link (the saved suites of seeds 33-52: 34 runs had such
    ports, 1 to 5 of them, at 0.37-0.74 of their rates, healthy runs among them; the one
    slowed link they held, seed 34 run 22's, sent at 0.24 and alone. Seed 34 run 29, a
    straggler under an ECMP all-to-all: a spine's port read slow at 0.48 beside a ToR's
    port at 0.48 and another at 0.72)."""
    mine = direction_of[port].name
    out = []
    for other, (full, sent) in sorted(standing.items()):
        name = direction_of[other].name
        if name == mine or sent is None or sent >= OVERFULL_ELSEWHERE_SENT:
            continue
        if full[0][0] <= end and start <= full[-1][0]:
            out.append(f"{name} at {sent:.2f}")
    return out


def _longest_full_run(
    rows: Sequence[tuple[float, int, int, int]],
) -> list[tuple[float, int, int, int]]:
    """The longest run of consecutive queue samples that held :data:`QUEUE_MIN_BYTES` or
    more: a port slower than what reaches it holds a standing queue, sample after sample;
    two shapers of one rate in a row hold a burst now and then (a sweep of sizes on a
    healthy fat-tree: 4 single samples over 27 s, read live as a slow port)."""
    best: list[tuple[float, int, int, int]] = []
    run: list[tuple[float, int, int, int]] = []
    for row in rows:
        run = [*run, row] if row[3] >= QUEUE_MIN_BYTES else []
        if len(run) > len(best):
            best = run
    return best


def _keep_earliest(out: dict[str, Suspect], suspect: Suspect) -> None:
    """``suspect`` in ``out`` under its target unless one there began earlier (a direction
    has several egress ports when its link has parallel twins: the first to show says
    when)."""
    said = out.get(suspect.target)
    if said is None or said.onset is None or (suspect.onset or 0.0) < said.onset:
        out[suspect.target] = suspect


def sending_below_rate(obs: Observations) -> list[Suspect]:
    """A switch port that held a queue and still sent far below its link's rate: that
    port is ``slow``. A port's egress is work-conserving: while bytes wait in its queue it
    sends at its rate, whatever congestion brought them there. Where its queue held
    :data:`BACKLOG_BYTES` at two consecutive samples, the port's transmit counter over
    that interval says how fast it sent; a port that did so in
    :data:`BACKLOGGED_INTERVALS` intervals or more and never above :data:`BELOW_RATE` of
    its rate in any of them sends slower than its link should. Unlike
    :func:`overfull_queues` this needs no reasoning about what arrived: an all-to-all's
    incast fills the queue of a healthy port too, which then sends at its rate. A port
    whose queue is seldom held from one sample to the next is read by the share of
    samples that found it waiting instead (:func:`_often_backlogged`)."""
    span = obs.span
    if span is None or not (slow_port_queues(obs) or obs.nic_queues) or not obs.counters:
        return []
    start, end = span[0] - 0.5, span[1] + 1.0
    out: dict[str, Suspect] = {}
    gpu_ports: dict[str, Suspect] = {}
    often: list[tuple[Suspect, float, str]] = []  # read by queue samples: (it, until, link)
    for d in obs.directions.values():
        for port in egress_ports(obs, d):
            rows = [r for r in egress_queue(obs, port) if start <= r[0] <= end]
            if d.src not in obs.fabric.switches:  # a GPU's NIC port: by the share only
                waited = _often_backlogged(obs, port, d, rows, NIC_BUSY_BYTES, NIC_BUSY_SHARE)
                if waited is not None:
                    _keep_earliest(gpu_ports, waited[0])
                continue
            paces = _interval_paces(obs, port, d, rows, BACKLOG_BYTES)
            if len(paces) < BACKLOGGED_INTERVALS or max(p for _, _, p in paces) > BELOW_RATE:
                waited = _often_backlogged(obs, port, d, rows) or _slow_while_dropping(
                    obs, port, d, rows
                )
                if waited is not None:
                    often.append((*waited, d.link_name))
                continue
            median = statistics.median(p for _, _, p in paces)
            evidence = [
                f"counters: {port[0]}'s egress to {d.dst} held >= {BACKLOG_BYTES:,} bytes "
                f"at both ends of {len(paces)} sampling intervals from {rel(obs, paces[0][0])} "
                f"to {rel(obs, paces[-1][1])}, and sent at {median:.2f} of its "
                f"{d.capacity_bps / 1e6:.1f} Mbit/s (at most {max(p for _, _, p in paces):.2f})",
                "a port with bytes waiting sends at its rate, whatever brought them: it sent "
                "slower than its link's rate",
            ]
            onset = paces[0][0]
            _keep_earliest(out, Suspect("link", d.name, "slow", BELOW_RATE_SCORE, evidence, onset))
    # one slowed link slows one GPU port; several GPUs' ports reading slow together are the
    # GPUs' own shapers running late on a busy machine, or TCP's bursts (seed 31: six ports
    # of a healthy all-to-all's GPUs at 0.25-0.28 of their rate), not a fault of one link
    if len(gpu_ports) == 1:
        out.update(gpu_ports)
    # the same of switch ports on other links at the same time, by either reading: an
    # all-to-all's TCP backing off at several uplinks, not one slow port (seed 50 run 42:
    # two leaf uplinks of a healthy ECMP all-to-all waiting at 75 % of their samples,
    # sending 0.33 of their rate; seed 55 run 24, found after: two ToR uplinks of a healthy
    # ECMP run discarding in 4-7 intervals while sending 0.22-0.28, overlapping 0.5 s)
    for suspect, until, link in often:
        alike = sorted(
            {
                other.target
                for other, other_until, other_link in often
                if other_link != link
                and (other.onset or 0.0) < until
                and (suspect.onset or 0.0) < other_until
            }
        )
        if alike:
            suspect.score *= OFTEN_ELSEWHERE_FACTOR
            suspect.evidence.append(
                f"but {', '.join(alike)} read so at the same time: several ports waiting and "
                "sending slow at once are the traffic's pattern, not one slow port"
            )
        _keep_earliest(out, suspect)
    return list(out.values())


def _often_backlogged(
    obs: Observations,
    port: Port,
    d: Direction,
    rows: Sequence[tuple[float, int, int, int]],
    busy_bytes: int = BUSY_BYTES,
    busy_share: float = BUSY_SHARE,
) -> tuple[Suspect, float] | None:
    """``port`` slow by the share of its queue samples that found bytes waiting against
    what it sent meanwhile (:data:`BUSY_WINDOW`): the window that reads slowest, if any
    reads slow, with the window's end. A quarter-rate port under TCP fills, discards and
    drains in turn, so its queue is seldom held from one sample to the next, but often
    found waiting. A switch port's queue must also have discarded :data:`BUSY_DROPS_MIN`
    packets over the window: its senders, held under their pace, overflow its few
    frames (a GPU's NIC queue is deep and discards nothing)."""
    transmitted = _transmitted(obs, port)
    if transmitted is None:
        return None
    at, (first, last) = transmitted
    switch_port = d.src in obs.fabric.switches
    best: tuple[float, float, float, float, float] | None = None
    for i in range(len(rows) - BUSY_WINDOW):
        # each sample stands for the interval after it: BUSY_WINDOW samples, as many
        # intervals, the share and the bytes sent over the same span
        share = sum(1 for r in rows[i : i + BUSY_WINDOW] if r[3] >= busy_bytes) / BUSY_WINDOW
        a, b = rows[i][0], rows[i + BUSY_WINDOW][0]
        if share < busy_share or b <= a:
            continue
        if a < first or b > last:
            continue  # outside the polled span
        if switch_port and rows[i + BUSY_WINDOW][2] - rows[i][2] < BUSY_DROPS_MIN:
            continue  # TCP held under its pace overflows a slowed switch port's queue
        pace = max(0.0, at(b) - at(a)) * 8 / (b - a) / d.capacity_bps
        if pace > BUSY_BELOW_RATE or pace > BUSY_RATIO * share:
            continue
        if best is None or pace / share < best[0]:
            best = (pace / share, share, pace, a, b)
    if best is None:
        return None
    _, share, pace, a, b = best
    evidence = [
        f"counters: {port[0]}'s egress to {d.dst} held >= {busy_bytes:,} bytes at "
        f"{share:.0%} of {BUSY_WINDOW} samples from {rel(obs, a)} to {rel(obs, b)}, and sent "
        f"at {pace:.2f} of its {d.capacity_bps / 1e6:.1f} Mbit/s meanwhile",
        f"a port with bytes waiting sends at its rate: found waiting that often, it should "
        f"have sent at {share:.2f} of its rate at least; it sent slower than its link's rate",
    ]
    return _unless_as_forecast(obs, Suspect("link", d.name, "slow", BUSY_SCORE, evidence, a), b), b


def _slow_while_dropping(
    obs: Observations, port: Port, d: Direction, rows: Sequence[tuple[float, int, int, int]]
) -> tuple[Suspect, float] | None:
    """``port`` slow by what it sent in the sampling intervals its queue discarded packets
    in (see :data:`DROPPING_INTERVALS`): the longest run of such intervals, one after the
    other, each sent at :data:`DROPPING_BELOW_RATE` of the port's rate or less (and
    :data:`DROPPING_MIN_RATE` at least), over which its queue was found holding bytes
    often enough (:data:`DROPPING_HELD_SHARE`) and discarded a share of what it sent
    (:data:`DROPPING_SHARE`). A fault
    that starts or ends mid-run leaves the intervals outside it at the full rate, hence a
    run, not all of them."""
    transmitted = _transmitted(obs, port)
    if transmitted is None:
        return None
    at, (first, last) = transmitted
    # (start, end, pace) of every sampling interval; the pace None where the queue
    # discarded nothing in it, which ends a run: a slowed port's queue stays full, and
    # discards in every interval (seed 58 run 12, a healthy pinned mix on a 2:1 fat-tree:
    # an uplink's queue discarded 8, 6, 2 and 1 packets in four intervals with two quiet
    # ones between them, while its connections waited out their timeouts at 0.23 of its
    # rate, and was called slow at 0.70)
    intervals: list[tuple[float, float, float | None]] = []
    for a, b in itertools.pairwise(rows):
        if not 0.2 <= b[0] - a[0] <= 2.0 or a[0] < first or b[0] > last:
            continue
        pace = max(0.0, at(b[0]) - at(a[0])) * 8 / (b[0] - a[0]) if b[2] > a[2] else None
        intervals.append((a[0], b[0], pace))
    best: list[tuple[float, float, float]] = []
    current: list[tuple[float, float, float]] = []
    for start, end, pace in intervals:
        if pace is None or not DROPPING_MIN_RATE <= pace / d.capacity_bps <= DROPPING_BELOW_RATE:
            current = []
            continue
        current = [*current, (start, end, pace)]
        if len(current) > len(best):
            best = current
    if len(best) < DROPPING_INTERVALS:
        return None
    inside = [r for r in rows if best[0][0] <= r[0] <= best[-1][1]]
    found = [r[3] >= DROPPING_HELD_BYTES for r in inside]
    if sum(found) < DROPPING_HELD_SHARE * len(found):
        return None  # full only in bursts, drained at its rate between them
    discarded, sent = inside[-1][2] - inside[0][2], inside[-1][1] - inside[0][1]
    if discarded < DROPPING_SHARE * sent:
        return None  # a packet now and then: bursts, not senders held back
    paces = [pace / d.capacity_bps for _, _, pace in best]
    evidence = [
        f"counters: {port[0]}'s egress queue to {d.dst} discarded packets in {len(best)} "
        f"sampling intervals in a row from {rel(obs, best[0][0])} to {rel(obs, best[-1][1])} "
        f"({discarded:,} beside {sent:,} sent), and the port sent at "
        f"{statistics.median(paces):.2f} of its {d.capacity_bps / 1e6:.1f} Mbit/s in them "
        f"(at most {max(paces):.2f})",
        "a queue discards only when full, and a port with a full queue sends at its rate: "
        "it sent slower than its link's rate",
    ]
    suspect = Suspect("link", d.name, "slow", DROPPING_SCORE, evidence, best[0][0])
    return _unless_as_forecast(obs, suspect, best[-1][1]), best[-1][1]


def _unless_as_forecast(obs: Observations, suspect: Suspect, end: float) -> Suspect:
    """``suspect`` (a port read slow by its queue's samples from its onset to ``end``)
    at :data:`AS_FORECAST_FACTOR` of its score when the operations meanwhile took no
    longer than the calibrated forecast of their configuration (the median of two or more
    within :data:`AS_FORECAST` of it): a quarter-rate link that the collective crosses
    slows its operations, and queue samples that read slow beside operations on time are
    bursts the samples caught (seed 50 run 45: a sweep's 64 KiB all-to-all at 0.98 of its
    forecast while a port discarded in four intervals at 0.2 of its rate). The links
    slowed to a quarter that the saved suites' collectives crossed took 1.5-3.8 times the
    forecast meanwhile, but one slowed to about what a ring sent through it anyway (seed
    34 run 1: 0.16-0.27 of its rate during the fault and after) slowed its operations by
    a tenth only; a healthy all-to-all whose uplinks' queues read slow ran at 1.08 of its
    forecast (seed 50 run 42). The two are not told apart, hence the narrow margin."""
    start = suspect.onset
    if start is None or not obs.forecast_seconds:
        return suspect
    ratios = [
        op.seconds / obs.forecast_seconds[op.config_id]
        for op in obs.operations
        if op.config_id in obs.forecast_seconds and op.end >= start and op.start <= end
    ]
    if len(ratios) < 2 or statistics.median(ratios) > AS_FORECAST:
        return suspect
    suspect.score *= AS_FORECAST_FACTOR
    suspect.evidence.append(
        f"but the {len(ratios)} operations meanwhile took {statistics.median(ratios):.2f} of "
        "their forecast time (median): nothing they crossed was slow"
    )
    return suspect


def _sent_bytes(obs: Observations, port: Port, start: float, end: float) -> float | None:
    """Bytes ``port`` transmitted between ``start`` and ``end``, its OpenFlow counter
    interpolated between polls; None outside the polled span."""
    transmitted = _transmitted(obs, port)
    if transmitted is None:
        return None
    at, (first, last) = transmitted
    if start < first or end > last:
        return None
    return max(0.0, at(end) - at(start))


def _transmitted(
    obs: Observations, port: Port
) -> tuple[Callable[[float], float], tuple[float, float]] | None:
    """``port``'s transmit counter as a function of time (interpolated between polls) and
    the span it was polled over; None without two polls. Built once for a port that is
    read over many windows. A GPU's NIC port, whose host is not polled, is read at the
    switch end of its link: what that port received is what the GPU's port sent (less what
    a lossy wire lost, which a slow port's reading does not need)."""
    counted: Port | None = port
    column = 2  # transmitted bytes
    if port[0] not in obs.fabric.switches:
        counted, column = _switch_end(obs, port), 1  # received bytes
    rows = obs.counters.get(counted) if counted is not None else None
    if not rows or len(rows) < 2:
        return None
    times = [r[0] for r in rows]

    def at(t: float) -> float:
        i = min(max(bisect.bisect_right(times, t) - 1, 0), len(rows) - 2)
        t0, b0, t1, b1 = rows[i][0], rows[i][column], rows[i + 1][0], rows[i + 1][column]
        return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else float(b0)

    return at, (rows[0][0], rows[-1][0])


def _switch_end(obs: Observations, port: Port) -> Port | None:
    """The switch port at the other end of a GPU's NIC port's link, if a switch's."""
    for link in obs.fabric.links_of(port[0]):
        if link.port_of(port[0]) == port[1]:
            peer = link.other(port[0])
            return (peer, link.port_of(peer)) if peer in obs.fabric.switches else None
    return None


def _moved(c: ConnectionView, start: float, end: float) -> bool:
    return any(start <= t <= end and n > 0 for t, n in c.samples)


def _arriving(
    obs: Observations, d: Direction, start: float, end: float
) -> tuple[list[ConnectionView], set[str], float] | None:
    """What could reach ``d``'s port between ``start`` and ``end``: the connections that
    crossed it and moved bytes then, the narrowest direction of each before it (one such
    direction feeding several connections counted once), and their rates together; None
    when none crossed it or a path is not all in the fabric model."""
    through = [c for c in obs.connections if d.name in c.directions() and _moved(c, start, end)]
    feeds = {_narrowest_upstream(obs, c, d.name) for c in through}
    if not through or None in feeds:
        return None
    known = {x for x in feeds if x is not None}
    return through, known, sum(obs.directions[x].capacity_bps for x in known)


def _narrowest_upstream(obs: Observations, c: ConnectionView, name: str) -> str | None:
    """The direction of ``c``'s path before ``name`` with the lowest rate (the first such),
    None when one is not in the fabric model."""
    before = c.directions()[: c.directions().index(name)]
    if not before or any(x not in obs.directions for x in before):
        return None
    return min(before, key=lambda x: obs.directions[x].capacity_bps)


def discarding(obs: Observations) -> dict[Port, list[tuple[float, float]]]:
    """Per switch port, the intervals between two queue samples in which its egress queue
    discarded packets, widened by :data:`UNCOUNTED_PAD_S` on each side."""
    return discards_of(obs.queues)


def discards_of(
    queues: dict[Port, list[tuple[float, int, int, int]]],
    pad: float = UNCOUNTED_PAD_S,
) -> dict[Port, list[tuple[float, float]]]:
    """:func:`discarding` of these queue samples, widened by ``pad``."""
    out: dict[Port, list[tuple[float, float]]] = {}
    for port, rows in queues.items():
        out[port] = [(a[0] - pad, b[0] + pad) for a, b in itertools.pairwise(rows) if b[2] > a[2]]
    return out


def _describe(obs: Observations, c: ConnectionView) -> str:
    return f"connection {c.id} (rank {c.src_rank} {c.src_gpu} -> rank {c.dst_rank} {c.dst_gpu})"


def _explain(
    obs: Observations,
    bad: Sequence[ConnectionView],
    everyone: Sequence[ConnectionView],
    fault: str,
    why: dict[int, str],
    *,
    typical_note: str = "",
    onsets: dict[int, float | None] | None = None,
    leaks: dict[str, Leak] | None = None,
    queues: dict[str, int] | None = None,
    kept: set[int] | None = None,
    window: tuple[float, float] | None = None,
) -> list[Suspect]:
    """The directions on the bad connections' paths, scored by how much of the badness
    they explain (recall) and how little health they would contradict (precision). A
    whole link (``A-B``) is a candidate too when bad connections cross it both ways and
    it explains more of them than either direction: a fault on a link usually takes both
    directions, and a ring's two neighbours may cross it in opposite directions. With
    ``leaks`` (a loss): a direction out of a switch is believed when that switch dropped
    packets inside, one out of a GPU when no switch on the bad paths did (its own
    egress is not counted by any switch). With ``kept`` (a slow link): only those healthy
    connections contradict a component (:func:`kept_share`); with ``window``, a queue
    full then is the evidence (:func:`full_queues`)."""
    # a loss with the switches' port counters at hand: a switch that lost packets on an
    # egress shows them as received and not sent (none leaking: its drops were its full
    # queues', congestion's, or none)
    counted = leaks is not None and bool(obs.counters)
    leaks = leaks or {}
    bad_switches = {n for c in bad for n in c.switches()}
    losing_data = {sw for sw, leak in leaks.items() if not leak.silent_acknowledgements()}
    listed = ", ".join(f"{_describe(obs, c)}: {why[c.id]}" for c in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    lead = f"transport: {len(bad)} connection(s) {fault}: {listed}{more}" + (
        f" ({typical_note})" if typical_note else ""
    )
    first = [onsets.get(c.id) for c in bad] if onsets else []
    onset = min((t for t in first if t is not None), default=None)
    # the same for every component ranked below: read the queues once
    congestion = _congestion_discards(obs, bad) if fault == "lossy" else 0
    links = _link_directions(obs)

    def components(c: ConnectionView) -> list[str]:
        mine = c.directions()
        return mine + [obs.directions[d].link_name for d in mine if d in obs.directions]

    def contradicting(c: ConnectionView) -> list[str]:
        return components(c) if kept is None or c.id in kept else []

    ranked = _ranked_components(bad, everyone, components, contradicting)
    recall_of = {name: recall for name, recall, _, _ in ranked}
    # live, the queue samples so far say which port was full as the run's do after it
    # (the held bytes of the switches' counters, the fallback, are a congested switch's
    # too: three healthy all-to-alls of seed 33 had a lone connection held at 0.37-0.42
    # of its share for 3 s blamed live at 0.85 on a switch so, and healthy after the run)
    queued = _with_live_queues(obs) if queues is not None else obs
    full = full_queues(queued, window) if queues is not None and queued.queues else {}
    out: list[Suspect] = []
    for name, recall, precision, through in ranked:
        if len(out) == 6:
            break
        if name in links:
            both = links[name]
            if recall <= max(recall_of.get(d.name, 0.0) for d in both):
                continue  # one direction explains as much: it is the more specific
            ends = [d for d in both if recall_of.get(d.name)]
        elif name in obs.directions:
            ends = [obs.directions[name]]
        else:
            continue
        evidence = [
            lead,
            f"paths: {name} is on {len(through)} of them and on "
            f"{_healthy_through(name, bad, everyone, contradicting)} healthy connection(s)"
            + (" that kept their share meanwhile" if kept is not None else ""),
        ]
        factor = 1.0
        sources = [d.src for d in ends]
        idle = _idle_ports(queued, ends, window) if fault == "slow" else {}
        if queues is not None and queued.queues:  # a slow direction: is its own queue full?
            said = {
                d.name: [full[port] for port in egress_ports(obs, d) if port in full] for d in ends
            }
            # a port slowed below the line never sends faster; one full of bursts does
            bursts = {
                d.name: pace
                for d in ends
                if said[d.name]
                and (pace := _fastest_pace(queued, egress_ports(obs, d), d, window))
                and pace > FULL_PACE_MAX
            }
            # a port found empty while they were held discarded bursts, not a backlog
            holding = [
                d for d in ends if said[d.name] and d.name not in bursts.keys() | idle.keys()
            ]
            evidence += [
                f"but {name_}'s port, its queue full, sent at {pace:.2f} of its rate at times "
                "meanwhile: bursts overflowed it, a slower port could not have sent so"
                for name_, pace in sorted(bursts.items())
            ]
            if holding:
                factor = 0.65 + 0.35 * len(holding) / len(ends)
                evidence += [
                    f"counters: {d.name}'s egress queue at {d.src} {said[d.name][0]}: a port "
                    "slower than its senders"
                    for d in holding
                ]
            elif any(src in obs.fabric.switches for src in sources) or bad_switches & {
                port[0] for port in full
            }:
                factor = 0.65  # below a direction whose queue is full
            else:
                evidence.append(
                    "counters: no switch on these paths had a full queue: the bytes waited at "
                    f"{' and '.join(sources)}'s own egress"
                )
        elif queues is not None:  # a bundle without queue samples: where do its bytes wait?
            holding_at = [src for src in sources if src in queues]
            if holding_at:
                # both ways slow: each direction's queue waits at its own source
                factor = 0.65 + 0.35 * len(holding_at) / len(sources)
                evidence += [
                    f"counters: {src} held {queues[src]:,} bytes received and not yet "
                    "sent through the run: the queue of a port slower than its senders"
                    for src in holding_at
                ]
            elif any(src in obs.fabric.switches for src in sources) or bad_switches & set(queues):
                factor = 0.65  # below a direction whose switch does hold the queue
            else:
                evidence.append(
                    "counters: no switch on these paths held a queue: the bytes waited at "
                    f"{' and '.join(sources)}'s own egress"
                )
        if idle and len(idle) == len(ends):
            factor *= NIC_IDLE_FACTOR
            evidence.append(
                f"but its {'queue' if len(idle) == 1 else 'queues'} found "
                f"{NIC_BUSY_BYTES:,} bytes or more waiting "
                f"({', '.join(idle.values())}) while they were held: its port sent what it "
                "was given, something further on held them"
            )
        switch_ends = [src for src in sources if src in obs.fabric.switches]
        if counted and switch_ends:
            # drops of acknowledgements only lost no data of these connections there
            # (as :func:`dropped_without_congestion` reads them): seed 56 run 27, a healthy
            # pinned ring, named a ToR's uplink lossy at 0.85 for one connection's 41
            # retransmissions, its data discarded by a full queue downstream, beside 20
            # packets of 99 bytes that ToR had dropped
            acks_only = [
                sw for sw in switch_ends if sw in leaks and leaks[sw].silent_acknowledgements()
            ]
            dropping = [src for src in switch_ends if src in leaks and src not in acks_only]
            if dropping:
                src = max(dropping, key=lambda sw: leaks[sw].silent)
                packets = leaks[src].silent
                evidence.append(leaks[src].describe(src))
                if not _leaks_alone(leaks[src]):
                    # no more short than the queues and the ports' sampling apart leaves
                    # a switch whose queues discard hundreds (a healthy all-to-all's ToR,
                    # 24 beside 281, named its busy uplink lossy at 0.57, seed 49): as
                    # weak as it is under what names an egress alone
                    floor = max(LOSSY_SILENT_MIN, LOSSY_OVER_QUEUED * (leaks[src].queued or 0))
                    factor *= 0.5 + 0.5 * packets / floor
                # the direction's own full queue discarding many more than the switch's
                # unexplained drops: its connections' retransmissions are that queue's,
                # and the drops may be at another egress of the switch (a 3 % loss on a
                # ToR's idle uplink, 30 drops, named on its busy one beside 104 discards
                # where its ring connection retransmitted, seed 48), as
                # :func:`dropped_without_congestion` weighs them
                own = sum(
                    obs.queue_drops(port, *_span(obs)) or 0
                    for d in ends
                    if d.src == src
                    for port in egress_ports(obs, d)
                )
                if own > packets:
                    factor *= 0.5 + 0.5 * packets / (packets + own)
                    evidence.append(
                        f"but {src}'s egress queue of this link discarded {own:,} packets "
                        "(full): the connections' retransmissions are its congestion's"
                    )
                others = [leak.silent for sw, leak in leaks.items() if sw not in dropping]
                if about_as_much(packets, others):
                    factor = 0.4  # every switch drops: congestion, this one no more than most
                    evidence.append(
                        f"but {len(others)} other switches dropped about as much "
                        f"(median {statistics.median(others):.0f} packets): congestion"
                    )
            else:
                factor = 0.3
                evidence += [
                    f"but {sw}'s drops were acknowledgements only ({leaks[sw].nbytes:,} bytes "
                    f"in {leaks[sw].packets} packets): none of these connections' data"
                    for sw in acks_only
                ]
        elif bad_switches & losing_data:
            # a switch on these paths dropped them, not this GPU's egress; one that dropped
            # acknowledgements only lost none of their data (the CI run of 2026-12-07: a
            # machine pause left every switch 5-24 small packets short, those on a 15 %
            # lossy GPU link's connection too, and the link was called healthy)
            factor = 0.3
        elif congestion:
            factor = 0.3  # a GPU's egress with full queues downstream: congestion
            evidence.append(
                f"but full queues on their paths discarded {congestion:,} packets: "
                "their retransmissions are congestion's"
            )
        if fault == "slow" and len(bad) == 1 and all(e.startswith("but ") for e in evidence[2:]):
            # one connection's path names each of its directions alike, and nothing but
            # its pace speaks for this one
            factor *= LONE_SLOW_FACTOR
            evidence.append(
                f"but one connection alone, and its path names its {len(bad[0].directions())} "
                "directions alike"
            )
        out.append(
            Suspect("link", name, fault, 0.85 * recall * precision * factor, evidence, onset)
        )
    if leaks and fault == "lossy":
        out += _beyond_first_hop(obs, bad, leaks, lead, onset)
    return out


def _fastest_pace(
    obs: Observations,
    ports: Sequence[Port],
    d: Direction,
    window: tuple[float, float] | None,
) -> float | None:
    """The fastest ``d``'s ports sent between two consecutive queue samples (0.2-2 s
    apart) within ``window`` (the run's span without one), as a share of its rate; None
    where the counters do not cover any such interval."""
    span = window or obs.span
    if span is None:
        return None
    paces = [
        pace
        for port in ports
        for _, _, pace in _interval_paces(
            obs, port, d, [r for r in egress_queue(obs, port) if span[0] <= r[0] <= span[1]]
        )
    ]
    return max(paces, default=None)


def _interval_paces(
    obs: Observations,
    port: Port,
    d: Direction,
    rows: Sequence[tuple[float, int, int, int]],
    backlog: int = 0,
) -> list[tuple[float, float, float]]:
    """(start, end, pace) for each two consecutive queue samples of ``port`` (``rows``)
    0.2-2 s apart that both held ``backlog`` bytes or more: what the port sent meanwhile
    (its transmit counter) as a share of ``d``'s rate, where the counters cover it."""
    out = []
    for a, b in itertools.pairwise(rows):
        if a[3] < backlog or b[3] < backlog or not 0.2 <= b[0] - a[0] <= 2.0:
            continue
        sent = _sent_bytes(obs, port, a[0], b[0])
        if sent is not None:
            out.append((a[0], b[0], sent * 8 / (b[0] - a[0]) / d.capacity_bps))
    return out


def _with_live_queues(obs: Observations) -> Observations:
    """``obs`` with the switch ports' queue samples so far as its :attr:`queues`, live
    (:attr:`Observations.live_queues`): for reading which port was full, and, with the
    allowance :func:`switch_leaks` makes, a switch's balance of packets."""
    if obs.queues or not obs.live_queues:
        return obs
    return replace(obs, queues=obs.live_queues)


def _idle_ports(
    obs: Observations, ends: Sequence[Direction], window: tuple[float, float] | None
) -> dict[str, str]:
    """The ends of a slow suspect whose port did not hold its connections, each with what
    says so: its egress queue (a GPU's NIC queue, :attr:`Observations.nic_queues`, or a
    switch's, live those so far) found waiting (:data:`NIC_BUSY_BYTES`) at under
    :data:`NIC_IDLE_SHARE` of its samples in ``window``, the span the connections were
    held (:data:`NIC_IDLE_MIN` samples at least): a port slower than what its senders
    send keeps their bytes waiting in its queue. Empty when the window is not known; an
    end whose queue was not sampled then is left out."""
    if window is None:
        return {}
    start, end = window[0] - 0.5, window[1] + 0.5
    found = {}
    for d in ends:
        counts = []
        for port in egress_ports(obs, d):
            rows = [r for r in egress_queue(obs, port) if start <= r[0] <= end]
            if len(rows) < NIC_IDLE_MIN:
                break
            waiting = sum(1 for r in rows if r[3] >= NIC_BUSY_BYTES)
            if waiting >= NIC_IDLE_SHARE * len(rows):
                break
            counts.append(f"{waiting} of {len(rows)}")
        else:
            if counts:
                found[d.name] = f"{d.name}'s at {' and '.join(counts)} samples"
    return found


def _congestion_discards(obs: Observations, conns: Sequence[ConnectionView]) -> int:
    """Packets the egress queues on ``conns``' paths discarded from full queues over the
    run (each port once), when they are :data:`CONGESTION_SHARE` or more of the segments
    the connections retransmitted (a discarded packet may be a GSO packet of many
    segments); else 0. A ring's connection whose bottleneck is a switch queue rather than
    its own NIC (which backpressures instead of dropping) retransmits what that queue
    discards, and its GPU's link out, which only it crosses, looked lossy (healthy runs:
    a pinned ring on astral-2pod-3x2, 124 segments beside 648 discards, 0.85; an ECMP
    ring on fat-tree-2pod-r6-2gpu, 63 beside 23, 0.85). Live, the queue samples so far."""
    obs = _with_live_queues(obs)
    if not obs.queues:
        return 0
    span = _span(obs)
    ports = {(h.node, h.out_port) for c in conns for h in c.path[1:] if h.out_port is not None}
    discarded = sum(obs.queue_drops(port, *span) or 0 for port in ports if port in obs.queues)
    retransmitted = sum(retransmissions(c, *span) for c in conns)
    return discarded if discarded and discarded >= CONGESTION_SHARE * retransmitted else 0


def _span(obs: Observations) -> tuple[float, float]:
    span = obs.span
    return (span[0], span[1] + 1.0) if span is not None else (0.0, math.inf)


def _link_directions(obs: Observations) -> dict[str, list[Direction]]:
    """Each fabric link's name (``A-B``) and its two directions."""
    out: dict[str, list[Direction]] = defaultdict(list)
    for d in obs.directions.values():
        out[d.link_name].append(d)
    return out


def _beyond_first_hop(
    obs: Observations,
    bad: Sequence[ConnectionView],
    leaks: dict[str, Leak],
    lead: str,
    onset: float | None,
) -> list[Suspect]:
    """Paths known to their first switch only: a loss inside that switch is on one of its
    egresses towards the rest of the fabric, each as likely as the next."""
    out: list[Suspect] = []
    firsts = {c.path[1].node for c in bad if len(c.path) >= 2 and not c.full_path}
    for switch in sorted(firsts & set(leaks)):
        ups = [
            d for d in obs.directions.values()
            if d.src == switch and d.dst in obs.fabric.switches
        ]  # fmt: skip
        for d in ups:
            evidence = [
                lead,
                leaks[switch].describe(switch),
                f"paths: known to {switch} only: {d.name} is one of its {len(ups)} links on",
            ]
            # a loss for certain (retransmissions, and the switch that dropped them), its
            # egress one of len(ups): above the threshold, ranked below a located one
            score = 0.9 * (0.55 + 0.45 / len(ups))
            out.append(Suspect("link", d.name, "lossy", score, evidence, onset))
    return out


def _healthy_through(
    name: str,
    bad: Sequence[ConnectionView],
    everyone: Iterable[ConnectionView],
    components: Callable[[ConnectionView], list[str]] | None = None,
) -> int:
    bad_ids = {c.id for c in bad}
    of = components or (lambda c: c.directions())
    return sum(1 for c in everyone if c.id not in bad_ids and name in of(c))


def _ranked_components(
    bad: Sequence[ConnectionView],
    everyone: Sequence[ConnectionView],
    components: object,
    contradicting: Callable[[ConnectionView], list[str]] | None = None,
) -> list[tuple[str, float, float, list[ConnectionView]]]:
    """Components (what ``components(c)`` lists for a connection) ranked by recall over
    the bad connections, then precision against the healthy ones (those a fault of the
    component would certainly have hit: ``contradicting(c)``, by default the same list)."""
    of = components  # a callable: connection -> component names
    against = contradicting or of
    bad_ids = {c.id for c in bad}
    through: dict[str, list[ConnectionView]] = defaultdict(list)
    healthy: dict[str, int] = defaultdict(int)
    for c in everyone:
        if c.id in bad_ids:
            for name in set(of(c)):  # type: ignore[operator]
                through[name].append(c)
        else:
            for name in set(against(c)):  # type: ignore[operator]
                healthy[name] += 1
    ranked = []
    for name, cs in through.items():
        recall = len(cs) / len(bad)
        precision = len(cs) / (len(cs) + healthy[name])
        ranked.append((name, recall, precision, cs))
    ranked.sort(key=lambda x: (-(x[1] * x[2]), -x[1], x[0]))
    return ranked


def _network(obs: Observations) -> dict[str, list[str]]:
    """Each node's neighbours over the fabric's network links (NVLink is not the network)."""
    adjacency: dict[str, list[str]] = defaultdict(list)
    for link in obs.fabric.links:
        if link.kind is not LinkKind.NVLINK:
            adjacency[link.a].append(link.b)
            adjacency[link.b].append(link.a)
    return adjacency


def _hops_to(obs: Observations, adjacency: dict[str, list[str]], gpu: str) -> dict[str, int]:
    """Hops from every switch that reaches ``gpu`` through switches only."""
    dist, queue = {gpu: 0}, deque([gpu])
    while queue:
        node = queue.popleft()
        for nxt in adjacency.get(node, ()):
            if nxt in obs.fabric.switches and nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def _shortest_path_switches(
    obs: Observations, hops: Callable[[str], dict[str, int]], src: str, dst: str
) -> set[str]:
    """The switches on some shortest path from GPU ``src`` to GPU ``dst`` (``hops``: each
    GPU's :func:`_hops_to`)."""
    to_dst, to_src = hops(dst), hops(src)
    both = {
        s: to_src[s] + to_dst[s] for s in to_dst.keys() & to_src.keys() if s in obs.fabric.switches
    }
    if not both:
        return set()
    shortest = min(both.values())
    return {s for s, n in both.items() if n == shortest}


def _explain_stalls(
    obs: Observations,
    bad: Sequence[ConnectionView],
    everyone: Sequence[ConnectionView],
    stalled: dict[int, list[tuple[float, float]]],
) -> list[Suspect]:
    """Stalled connections: a switch dropping what it forwards to one destination
    (blackhole: the switch and that destination are on every stalled path, and healthy
    connections cross the switch to elsewhere), else a direction that carried nothing."""
    out: list[Suspect] = []
    onset = min(s[0][0] for s in stalled.values())
    stalls_end = max(b for s in stalled.values() for _, b in s)
    longest = max(b - a for s in stalled.values() for a, b in s)
    listed = ", ".join(_describe(obs, c) for c in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    lead = (
        f"transport: {len(bad)} connection(s) stalled with data outstanding, the longest "
        f"{longest:.1f} s, from {rel(obs, onset)}: {listed}{more}"
    )
    full = [c for c in bad if c.full_path]
    leaks = switch_leaks(obs)

    adjacency = _network(obs)
    reach: dict[str, dict[str, int]] = {}

    def hops(gpu: str) -> dict[str, int]:
        if gpu not in reach:
            reach[gpu] = _hops_to(obs, adjacency, gpu)
        return reach[gpu]

    ways: dict[tuple[str, str], set[str]] = {}

    # switches that dropped more than healthy ones leave (up to 18 packets), with room in
    # their queues: a hole may be there though no recorded path says so
    dropping = {sw for sw, leak in leaks.items() if leak.silent >= BOTH_ENDS_MIN}

    def way_back(c: ConnectionView) -> set[str]:
        # the acknowledgements' path is not recorded (under ECMP the reverse five-tuple
        # hashes on its own): a dropping switch on a shortest path back may carry them
        key = (c.dst_gpu, c.src_gpu)
        if key not in ways:
            ways[key] = _shortest_path_switches(obs, hops, *key) & dropping
        return ways[key] | set(c.switches())

    def pairs(c: ConnectionView) -> list[str]:
        # a switch dropping what goes to a GPU stalls the connections to it, and those
        # from it whose acknowledgements cross the switch on their way back
        return [f"{s}|{c.dst_gpu}" for s in c.switches()] + [
            f"{s}|{c.src_gpu}" for s in sorted(way_back(c))
        ]

    def hit(c: ConnectionView) -> list[str]:
        # a healthy connection contradicts a hole only if its data went through the switch
        # to that GPU: the path of a connection's acknowledgements is not recorded (under
        # ECMP or pinned paths the way back is its own), so one from the GPU proves nothing
        return [f"{s}|{c.dst_gpu}" for s in c.switches()]

    # each with how many of its stalled connections only their acknowledgements place
    # there, and the drops its score stands by
    holes: list[tuple[Suspect, int, int]] = []
    # what a switch of this fabric drops that no queue explains, hole or not: the median
    # switch's (seed 58 run 42, a healthy ECMP all-to-all: every aggregation and core
    # switch 5-8 packets of 54-92 bytes short; one connection stalled 1.7 s over the
    # warm-up through a core switch 5 short, called its blackhole at 0.90)
    typical = statistics.median(
        max(0, leaks[s].silent) if s in leaks else 0
        for s, switch in obs.fabric.switches.items()
        if switch.tier is not Tier.NVLINK
    )
    onsets: dict[str, float | None] = {}  # switch -> when its unexplained drops began
    # one stalled connection, whatever switch is weighed (below): what it lost into its
    # longest stall, and whether that stall alone is a hole's (LONE_HOLE_S)
    first_stalls = stalled.get(bad[0].id, [])
    lost_into = retransmitted_in_longest(bad[0], first_stalls)
    lone_hole = (
        len(bad) == 1
        and longest >= LONE_HOLE_S
        and lost_into >= HOLE_RETRANS_MIN
        and _viewed_throughout(bad[0], first_stalls)
        and not _lossy_outside(bad[0], first_stalls, everyone)
    )
    for name, recall, precision, through in _ranked_components(bad, everyone, pairs, hit):
        switch, destination = name.split("|")
        others = sum(1 for c in everyone if switch in c.switches() and c.dst_gpu != destination)
        # the switch that drops them received them and sent nothing on: it leaks, and
        # while they stalled (drops that began after every stall ended are not this hole's;
        # dated only where a full queue's discards do not swamp them: the queue and port
        # counters are sampled apart, and thousands of discards make the rest jitter)
        leak = leaks.get(switch)
        datable = leak is not None and (leak.queued or 0) <= leak.silent
        if datable and switch not in onsets:
            onsets[switch] = silent_onset(obs, switch)
        began = onsets[switch] if datable else None
        # drops that do not stand by this hole, and why (the evidence says so instead)
        excuse = None
        if leak is not None and began is not None and began > stalls_end + 1.0:
            excuse = (
                f"counters: {switch} dropped packets no full queue explains, but from "
                f"{rel(obs, began)}, after the stalls ended"
            )
        elif leak is not None and 0 < leak.silent <= typical:
            # no more than the fabric's median switch dropped: what every switch leaves
            excuse = (
                f"but {switch} dropped {leak.silent:,} packets no full queue explains, no "
                f"more than the fabric's median switch ({typical:g}): what every switch leaves"
            )
        elif (
            leak and len(bad) == 1 and longest < HOLE_S
            and leak.queued is not None and leak.silent < leak.queued
        ):  # fmt: skip
            # one connection's short stall beside a switch whose full queues discarded
            # more than it dropped otherwise: congestion's timeouts as likely as a hole
            # (seed 57 run 9, a healthy pinned sweep on a 2:1 fat-tree: one connection
            # stalled 2.1 s, its core switch 5 packets short beside 6 discarded, called a
            # blackhole at 0.85); a hole's lone connection stalls as long as the hole lasts
            excuse = (
                f"but {switch}'s full queues discarded {leak.queued:,} packets, more than "
                f"the {leak.silent:,} it dropped otherwise: one connection's stall under "
                f"{HOLE_S:g} s beside them is congestion's timeouts as likely"
            )
        if excuse:
            leak = None
        elsewhere = sum(1 for c in bad if destination not in (c.dst_gpu, c.src_gpu))
        # only first hops known, or several destinations: less sure; but drops that no
        # full queue explains, counted at this switch, say the hole is here
        if not full or (elsewhere and not (leak and leak.queued is not None)):
            recall *= 0.7
        score = 0.9 * recall * precision * (1.0 if others else 0.6) * (1.0 if leak else 0.6)
        if leak:
            # two switches on every stalled path, both leaking: the one whose drops no
            # full queue explains, not the one whose drops are mostly congestion's
            score *= 0.9 + 0.1 * leak.silent / max(1, leak.packets)
        # one stalled connection stands by the switch's drops only if it lost something
        # in its stall: a connection whose segments a hole drops retransmits them when its
        # timeout fires, well within a second (a healthy run's lone 1.1 s stall, over the
        # warm-up's end, retransmitted nothing, beside 5 drops of its switch: seed 21)
        score *= 1.0 if len(bad) > 1 or (leak and lost_into > 0) or lone_hole else LONE_STALL
        acks = sum(1 for c in through if c.dst_gpu != destination)
        evidence = [
            lead,
            (
                f"paths: every stalled connection goes to {destination}"
                if not elsewhere
                else f"paths: {len(bad) - elsewhere} of the {len(bad)} stalled connections "
                f"go to {destination}"
            )
            + (f" (or, {acks} of them, comes from it: its acknowledgements)" if acks else "")
            + (
                f" and {len(through)} of {len(bad)} cross {switch}"
                if recall < 1
                else f" through {switch}"
            )
            + (
                f" ({unrecorded} only on a shortest way back for their acknowledgements, "
                f"which no path records: {switch} dropped more than a healthy switch does)"
                if (unrecorded := sum(1 for c in through if switch not in c.switches()))
                else ""
            ),
            f"paths: {others} healthy connection(s) cross {switch} to other GPUs: it forwards"
            " everything else",
        ]
        if leak:
            evidence.append(leak.describe(switch))
        elif excuse:
            evidence.append(excuse)
        holes.append(
            (
                Suspect("switch", switch, "blackhole", score, evidence, onset=onset),
                acks,
                max(0, leak.silent) if leak else 0,
            )
        )
    # the switches of one stalled connection's path explain it alike, and a leak at all
    # stands by each the same: of those tied, the one that dropped fewer packets no queue
    # explains than another is the lesser suspect, by up to a tenth (a CI run of the
    # blackhole test: the hole's ToR 49 packets short, three switches of its way back
    # 5-20 each, as healthy switches of that run were; all four at 0.90, the ToR fourth)
    most: dict[float, int] = {}
    for hole, _, silent in holes:
        tie = round(hole.score, 6)
        most[tie] = max(most.get(tie, 0), silent)
    for hole, _, silent in holes:
        tie = round(hole.score, 6)
        if 0 < silent < most[tie]:
            hole.score *= 0.9 + 0.1 * silent / most[tie]
    # one per switch: its best-explained destination, where the stalled data goes before
    # where only their acknowledgements do
    best: dict[str, Suspect] = {}
    for hole, _, _ in sorted(holes, key=lambda h: (-h[0].score, h[1])):
        best.setdefault(hole.target, hole)
    out += sorted(best.values(), key=lambda s: -s.score)[:3]
    for name, recall, precision, through in _ranked_components(
        bad, everyone, lambda c: c.directions()
    )[:3]:
        if name not in obs.directions:
            continue
        evidence = [
            lead,
            f"paths: {name} is on {len(through)} of the {len(bad)} stalled connections",
        ]
        lone = LONE_STALL if len(bad) == 1 else 1.0
        out.append(
            Suspect("link", obs.directions[name].link_name, "down",
                    0.5 * recall * precision * lone, evidence, onset=onset)
        )  # fmt: skip
    return out


# --- the application layer --------------------------------------------------------------------


def stragglers(obs: Observations) -> list[Suspect]:
    """A rank that entered at least :data:`LATE_OPS` operations (two: back to back) late
    by :data:`LATE_S` or more beyond the operation's typical rank (entry lateness,
    evidence.entry_lateness),
    alone each time, and by about the same amount (a straggler's delay is its own and the
    same every operation; a busy machine delays several ranks, by varying amounts)."""
    by_op: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for (config_id, iteration, rank), late in obs.lateness.items():
        by_op[(config_id, iteration)][rank] = late
    late_ops: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for (config_id, iteration), ranks in by_op.items():
        if len(ranks) < 3:
            continue
        typical = statistics.median(ranks.values())
        behind = [
            (rank, late - typical) for rank, late in ranks.items() if late - typical >= LATE_S
        ]
        behind.sort(key=lambda rx: -rx[1])
        # several ranks late at once by similar amounts: the machine, not one GPU; one
        # far later than the rest (a straggler's whole delay beside a congested path's
        # tens of ms at two others) is still that rank's
        if len(behind) == 1 or (len(behind) > 1 and behind[0][1] >= DOMINANT * behind[1][1]):
            rank, excess = behind[0]
            late_ops[(config_id, rank)].append((iteration, excess))
    starts = {(o.config_id, o.iteration): o.start for o in obs.operations}
    out = []
    for (config_id, rank), ops in late_ops.items():
        excesses = sorted(x for _, x in ops)
        if len(ops) < LATE_OPS or excesses[-1] > 2.5 * excesses[len(excesses) // 4]:
            continue  # too few, or too uneven for one delay that every operation pays
        iterations = sorted(i for i, _ in ops)
        # the operations between its first late one and its last in which its entry was
        # measured (an operation whose first byte a sample missed says nothing either way)
        span = sum(
            1
            for (c, i), ranks in by_op.items()
            if c == config_id
            and iterations[0] <= i <= iterations[-1]
            and rank in ranks
            and len(ranks) >= 3
        )
        if len(ops) < 3 and span != len(ops):
            continue  # two late operations count only back to back (of those measured)
        if len(ops) < FEW_LATE_OPS and excesses[0] < TWO_LATE_S:
            continue  # and few only by more than a busy machine's hiccup
        if len(ops) < LATE_SHARE * span:
            continue  # late now and then, not in every operation while it lasted
        gpu = obs.gpus_by_rank.get(config_id, {}).get(rank, f"rank {rank}")
        measured = sum(1 for c, _ in by_op if c == config_id)
        iterations = sorted(i for i, _ in ops)
        lateness = statistics.median(x for _, x in ops)
        evidence = [
            f"application: {obs.labels[config_id]}: rank {rank} ({gpu}) entered {len(ops)} "
            f"of {measured} operations (iterations {_ranges(iterations)}) late, by "
            f"{lateness * 1e3:.0f} ms (median, beyond the emulated latency and the typical "
            "rank), the others waiting for its first bytes",
        ]
        score = min(0.95, 0.6 + 0.07 * len(ops))
        onset = starts.get((config_id, iterations[0]))
        out.append(Suspect("gpu", gpu, "straggler", score, evidence, onset=onset))
    return out


def _ranges(values: Sequence[int]) -> str:
    """``2-4, 7``: consecutive integers as ranges."""
    parts: list[str] = []
    for v in values:
        if parts and parts[-1].split("-")[-1] == str(v - 1):
            parts[-1] = parts[-1].split("-")[0] + f"-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)


# --- the controller ---------------------------------------------------------------------------


def controller_outage(obs: Observations) -> list[Suspect]:
    """The controller's process started again, its switches disconnected, or its counter
    polling paused, during the run. What falls within a restart the run made itself (a
    policy switch between configurations: ``obs.own_restarts``) is the run's, not a fault:
    the same signs, planned, with no traffic measured meanwhile."""
    span = obs.span
    if span is None:
        return []
    own = obs.own_restarts

    def planned(t: float) -> bool:
        return any(r.holds(t) for r in own)

    loads = [
        e for e in obs.events if e.kind == "log" and "loading app controllers.app" in e.message
    ]
    # a controller whose apps load during the run started again (the first start is the
    # bring-up's, before the first timed operation; a fabric held by a test or by
    # astral up may have started it long before, out of the bundle's events)
    restarts = [e.t for e in loads if e.t >= span[0] - 1.0 and not planned(e.t)]
    disconnects = [
        e for e in obs.events if e.kind == "disconnect" and e.t >= span[0] and not planned(e.t)
    ]
    gaps = [
        (a, b)
        for a, b in _telemetry_gaps(obs)
        if not any(r.explains_pause(a, b, TELEMETRY_GAP_S) for r in own)
    ]
    if not restarts and not gaps and not disconnects:
        return []
    evidence = []
    onset = None
    if gaps:
        a, b = gaps[0]
        onset = a
        evidence.append(
            f"counters: polling of every switch paused {b - a:.1f} s, from {rel(obs, a)}"
        )
    if restarts:
        evidence.append(
            f"controller: its process started again at {rel(obs, restarts[0])} (its apps loaded "
            "again, every switch connected again)"
        )
        onset = onset if onset is not None else restarts[0]
    if disconnects:
        evidence.append(f"controller: {len(disconnects)} switch disconnect(s)")
        onset = min(onset or disconnects[0].t, disconnects[0].t)
    score = 0.95 if restarts or (gaps and disconnects) else 0.6
    return [Suspect("controller", "controller", "controller outage", score, evidence, onset=onset)]


def _telemetry_gaps(obs: Observations) -> list[tuple[float, float]]:
    """Pauses of at least :data:`TELEMETRY_GAP_S` in the counter polling of every switch
    at once (the controller polls them; one busy switch pausing is not an outage), and
    while a run goes (``obs.now``) one not over yet."""
    span = obs.span
    if span is None or not obs.counters:
        return []
    polled = sorted({round(r[0], 1) for rows in obs.counters.values() for r in rows})
    times = [t for t in polled if span[0] - 1 <= t <= span[1] + 1]
    gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a >= TELEMETRY_GAP_S]
    # a run still going: polling that stopped and has not come back yet (beyond the lag
    # with which the telemetry file is read) is a gap up to now
    if obs.now is not None and polled and obs.now - polled[-1] >= TELEMETRY_GAP_S + LIVE_LAG_S:
        gaps.append((polled[-1], obs.now))
    return gaps
