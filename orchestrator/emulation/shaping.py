"""How an emulated link is shaped: rendered as tc argument lists, applied by the emulation.

Pure data (docs/architecture.md: render, then check, then start). Each end of a link shapes its own
egress, so each direction of the link is shaped exactly once, by its sender, and carries the
configured rate. docs/fidelity.md holds the measurements behind every number below.

The recipe, per interface::

    root  htb (default class 1:1)
    1:1   htb rate R ceil R burst B cburst B quantum Q     B = max(R * 10 ms, 8 frames)
    10:   leaf FIFO                                        switch side: bfifo, R * 10 ms
                                                           host side:   pfifo, 1000 packets

Why each piece is there:

- **One HTB class, rate = ceil = R.** A token bucket that queues rather than drops (an
  ingress policer would drop, and TCP over a policer reaches well under its rate; this
  kernel has no police action anyway). TBF would do for one class as well; HTB is what
  Mininet and the earlier measurements used. It charges a GSO packet its wire bytes
  (headers of every segment included), so rates stay exact with userspace TSO.
- **burst = cburst = max(R x 10 ms, 8 full frames).** HTB sends while *both* buckets are
  non-negative and caps each at its depth; tokens that arrive beyond the depth while the
  qdisc waits (for a late timer or softirq, or for packets the datapath delivers late) are
  lost for good. Every hop of a path has the same rate, so all but the first shaper see
  their packets arrive with the datapath's jitter, milliseconds on a loaded 2-core machine,
  and must catch up afterwards. Measured on one flow over 5 bridges: a 1 ms bucket lost
  3-12 % of the link, 4 ms up to 9 % at 100 Mbit/s on a busy machine, 10 ms nothing
  measurable (and 8 flows sharing a link were as fair or fairer with 10 ms than with 5).
  Mininet's TCLink sets ``burst 15k`` but no cburst; tc then derives cburst = ceil/HZ +
  MTU, and with high-resolution psched (HZ reported as 10^9) that is 1600 bytes, one frame.
  A depth in *time* keeps the tolerance the same on every link; the floor in frames only
  matters below 10 Mbit/s. The bucket equals the queue below: after an idle spell a link
  may send one queue's worth back to back, which the next hop (same rate) absorbs.
- **quantum = one frame.** Only one class, so it never matters; setting it keeps tc from
  warning ``quantum of class is big`` (r2q=10 gives R/80 bytes, over 200000 above
  16 Mbit/s), which Mininet reports as ``*** Error``.
- **Switch side: bfifo of R x 10 ms (at least 16 frames).** The leaf is the switch's
  buffer, so it decides when and whom TCP loses packets from. Bytes, not packets: with
  userspace TSO, Open vSwitch forwards GSO packets of up to 64 kB, and a packet-count
  limit would hold anywhere between 1.5 kB and 64 kB per slot. 10 ms is several times the
  emulator's own RTT (about 1-3 ms through 5 userspace bridges, more under load), enough
  for TCP to keep the link busy across a loss, and short enough that 8 CUBIC or Reno
  flows sharing a link lose packets often enough to converge to equal shares (Jain's
  index 0.99-1.00 over a minute, 0.95-0.99 over 13 s; a 1000-packet pfifo gave 0.24-0.62
  and 0.5-1.6 s of standing queue). It also
  keeps the bytes queued at Open vSwitch's egress small: ovs-vswitchd sends on every
  port through one AF_PACKET socket, and when the packets queued in all its egress
  qdiscs together exceed that socket's send buffer (net.core.wmem_default, 208 kB) it
  drops packets on *any* port without counting them anywhere. A byte limit per queue
  keeps that from happening while few ports are congested (two full queues at 100 Mbit/s
  already exceed it); beyond, the emulation has to raise that socket's buffer
  (docs/fidelity.md).
- **Host side: pfifo of 1000 packets.** The GPU's own egress is its NIC: a real NIC
  backpressures the stack instead of dropping, and TCP Small Queues keeps each socket's
  share of this queue to about a millisecond of data, so a deep queue here never drops;
  a shallow one drops locally, which TCP treats as congestion and which BBR in
  particular recovers from badly.
- **overhead_bytes** (default 0) adds tc's per-frame ``overhead``: 24 emulates preamble,
  inter-frame gap and FCS, making the shaped rate a true line rate. With 0, R counts
  Ethernet frames as tc sees them (header + IP packet), and the best TCP goodput over
  1500-byte frames is R x 1460/1514 = 0.964 R (the GPUs send no TCP timestamps; 0.956 R
  with them): ``topologies.units.TCP_PAYLOAD_SHARE``.

Apply after the interface has joined its Open vSwitch bridge: ovs-vswitchd deletes a root
qdisc it finds on a port when the port is added (and so again when ovs-vswitchd restarts).
Mininet works around the same conflict by re-running TCIntf.config after ``add-port``.
:func:`check_shaping` tells whether an interface still carries the recipe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Ethernet header bytes on top of the MTU (tc accounts dst+src+ethertype, no FCS).
ETH_HEADER = 14


@dataclass(frozen=True)
class ShapingRecipe:
    """Parameters of the shaper. Defaults are the measured recipe (docs/fidelity.md)."""

    #: HTB bucket depth (burst and cburst) as time at the link rate, seconds.
    burst_s: float = 0.010
    #: ... but never fewer than this many full frames.
    min_burst_frames: int = 8
    #: Switch-side leaf FIFO (bfifo) depth as time at the link rate, seconds.
    queue_s: float = 0.010
    #: ... but never fewer than this many full frames.
    min_queue_frames: int = 16
    #: Host-side (NIC) leaf queue depth, packets.
    host_queue_packets: int = 1000
    #: Switch-side leaf: ``head-drop`` (pfifo_head_drop of ``queue_s`` in full frames) or
    #: ``bfifo`` (drop-tail, ``queue_s`` in bytes).
    switch_queue: str = "head-drop"
    #: Host-side leaf: ``pfifo`` (``sfq`` where the kernel has it: round robin per flow).
    host_queue: str = "pfifo"
    #: Extra bytes per frame HTB charges (tc ``overhead``): 24 = preamble + gap + FCS.
    overhead_bytes: int = 0
    #: Per-flow leaf classes under the link's class (0: one leaf for every flow). With N,
    #: a classifier hashes each TCP packet's addresses and ports to one of N classes that
    #: share the link round robin in bytes (HTB's deficit round robin), each with its own
    #: leaf queue of the recipe's kind and 1/N of its depth (at least ``min_flow_packets``).
    flow_queues: int = 0
    #: ... each flow queue holds at least this many packets.
    min_flow_packets: int = 2
    #: Flow queues on the GPUs' own ends too (False: switch side only; a GPU's NIC then
    #: keeps one FIFO, which serves its own flows' packets in turn).
    host_flow_queues: bool = True
    #: Bytes per packet as a multiple of the reference recipe's (orchestrator.emulation.recipe,
    #: ``scaled-packets``): the GPUs' packets carry this many times the segments, and every
    #: packet-counted queue keeps the depth in packets it has at 1/``packet_scale`` of the
    #: rate, so that a link at F x R behaves in time as the reference does at R.
    packet_scale: int = 1
    #: The fabric's MTU (``jumbo-packets`` raises it; every frame-counted figure follows).
    mtu: int = 1500

    def frame_bytes(self, mtu: int | None = None) -> int:
        """A full frame as tc counts it."""
        return (mtu or self.mtu) + ETH_HEADER

    def burst_bytes(self, rate_bps: float, mtu: int | None = None) -> int:
        """HTB burst and cburst for a link of ``rate_bps``."""
        by_time = rate_bps / 8 * self.burst_s
        return max(round(by_time), self.min_burst_frames * self.frame_bytes(mtu))

    def queue_bytes(self, rate_bps: float, mtu: int | None = None) -> int:
        """Byte limit of the switch-side leaf FIFO for a link of ``rate_bps``."""
        by_time = rate_bps / 8 * self.queue_s
        return max(round(by_time), self.min_queue_frames * self.frame_bytes(mtu))

    def queue_frames(self, rate_bps: float, mtu: int | None = None) -> int:
        """The same depth in packets (the head-drop queue counts packets): full frames, or
        with ``packet_scale`` F the depth the queue has at rate/F (packets F times larger)."""
        by_packets = self.queue_bytes(rate_bps / self.packet_scale, mtu) / self.frame_bytes(mtu)
        return max(self.min_queue_frames, round(by_packets))

    def leaf(
        self, rate_bps: float, mtu: int | None = None, *, host_side: bool = False, share: int = 1
    ) -> list[str]:
        """tc arguments of a leaf qdisc under an HTB class (kind and parameters): the
        link's one leaf, or (``share`` = N) one of its N flow queues, 1/N of the depth."""
        if host_side:
            if self.host_queue == "pfifo":
                return ["pfifo", "limit", self._split(self.host_queue_packets, share)]
            if self.host_queue == "sfq":
                # perturb 0: a flow keeps its bucket; depth = limit: no per-flow tail drops
                # before the whole queue is full; quantum one frame (round robin in bytes).
                packets = self._split(self.host_queue_packets, share)
                return [
                    "sfq",
                    "limit",
                    packets,
                    "depth",
                    "127",
                    "quantum",
                    str(self.frame_bytes(mtu)),
                ]
            if self.host_queue == "head-drop":
                frames = self._split(self.queue_frames(rate_bps, mtu), share)
                return ["pfifo_head_drop", "limit", frames]
            raise ValueError(f"unknown host-side queue {self.host_queue!r}")
        if self.switch_queue == "head-drop":
            return [
                "pfifo_head_drop",
                "limit",
                self._split(self.queue_frames(rate_bps, mtu), share),
            ]
        if self.switch_queue == "bfifo":
            limit = max(
                round(self.queue_bytes(rate_bps, mtu) / share),
                self.min_flow_packets * self.frame_bytes(mtu),
            )
            return ["bfifo", "limit", str(limit)]
        raise ValueError(f"unknown switch-side queue {self.switch_queue!r}")

    def _split(self, packets: int, share: int) -> str:
        if share <= 1:
            return str(packets)
        return str(max(self.min_flow_packets, -(-packets // share)))

    def flow_classids(self) -> list[str]:
        """The flow queues' HTB class ids (``1:100`` ...), empty without flow queues."""
        return [f"1:{FLOW_CLASS_BASE + k:x}" for k in range(self.flow_queues)]


#: Minor number of the first flow queue's class (hex in tc's notation: 1:100).
FLOW_CLASS_BASE = 0x100


def flow_hash_bytecode(flow_queues: int) -> str:
    """A classic BPF program (tc ``bpf bytecode``) that maps a TCP/IPv4 frame to one of
    ``flow_queues`` (a power of two) HTB classes by its addresses and ports.

    The program returns the class id itself (cls_bpf takes a return value other than 0 and
    -1 as the class). hash = (saddr ^ daddr ^ (sport << 16 | dport)) x 2654435761 (Knuth's
    multiplicative hash), top bits; anything that is not TCP over IPv4 goes to the first
    class. Frames are read from the Ethernet header (egress: skb->data is the MAC header).
    """
    bits = flow_queues.bit_length() - 1
    if flow_queues < 2 or 1 << bits != flow_queues:
        raise ValueError(f"flow queues must be a power of two >= 2, got {flow_queues}")
    base = (1 << 16) | FLOW_CLASS_BASE
    ops = [
        (0x28, 0, 0, 12),  # ldh [12]            ethertype
        (0x15, 0, 16, 0x0800),  # jne IPv4 -> other
        (0x30, 0, 0, 23),  # ldb [23]            IP protocol
        (0x15, 0, 14, 6),  # jne TCP -> other
        (0x20, 0, 0, 26),  # ld [26]             source address
        (0x02, 0, 0, 0),  # st M[0]
        (0x20, 0, 0, 30),  # ld [30]             destination address
        (0x61, 0, 0, 0),  # ldx M[0]
        (0xAC, 0, 0, 0),  # xor x
        (0x02, 0, 0, 0),  # st M[0]
        (0xB1, 0, 0, 14),  # ldxb 4*([14]&0xf)   IP header length
        (0x40, 0, 0, 14),  # ld [x+14]           source and destination ports
        (0x61, 0, 0, 0),  # ldx M[0]
        (0xAC, 0, 0, 0),  # xor x
        (0x24, 0, 0, 2654435761),  # mul
        (0x74, 0, 0, 32 - bits),  # rsh: the top bits
        (0x04, 0, 0, base),  # add: class 1:100 + hash
        (0x16, 0, 0, 0),  # ret a
        (0x06, 0, 0, base),  # other: ret 1:100
    ]
    return f"{len(ops)}," + ",".join(f"{c} {jt} {jf} {k}" for c, jt, jf, k in ops)


DEFAULT_RECIPE = ShapingRecipe()


def _rate(rate_bps: float) -> str:
    """tc rate in bit/s (exact; tc accepts ``25000000bit``)."""
    return f"{max(1, round(rate_bps))}bit"


def shaping_commands(
    intf: str,
    rate_bps: float,
    recipe: ShapingRecipe = DEFAULT_RECIPE,
    *,
    mtu: int | None = None,
    host_side: bool = False,
) -> list[list[str]]:
    """tc commands (argv lists) that shape ``intf``'s egress to ``rate_bps``.

    Run them in the namespace that owns ``intf``, after the interface has joined its
    bridge if it is a switch port. ``host_side`` is True for the emulated GPU's (NIC's)
    end of a link: it gets a deep packet FIFO instead of the switch buffer. ``mtu`` is
    the interface's MTU (it sets the frame-count floors and the quantum). Every command
    replaces what is there, so applying twice is harmless.
    """
    if rate_bps <= 0:
        raise ValueError(f"rate must be positive, got {rate_bps!r}")
    mtu = mtu or recipe.mtu
    rate = _rate(rate_bps)
    burst = str(recipe.burst_bytes(rate_bps, mtu))
    bucket = ["burst", burst, "cburst", burst, "quantum", str(recipe.frame_bytes(mtu))]
    if recipe.overhead_bytes:
        bucket += ["overhead", str(recipe.overhead_bytes)]
    htb_class = ["rate", rate, "ceil", rate, *bucket]
    classes = recipe.flow_classids() if recipe.host_flow_queues or not host_side else []
    default = classes[0].split(":")[1] if classes else "1"
    commands = [
        ["tc", "qdisc", "replace", "dev", intf, "root", "handle", "1:", "htb", "default", default],
        [
            "tc",
            "class",
            "replace",
            "dev",
            intf,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            *htb_class,
        ],
    ]
    if not classes:
        leaf = recipe.leaf(rate_bps, mtu, host_side=host_side)
        commands.append(
            ["tc", "qdisc", "replace", "dev", intf, "parent", "1:1", "handle", "10:", *leaf]
        )
        return commands
    # Flow queues: each guaranteed 1/N, all allowed the whole link (ceil), so that active
    # flows share it round robin whatever their number.
    share = _rate(rate_bps / len(classes))
    leaf = recipe.leaf(rate_bps, mtu, host_side=host_side, share=len(classes))
    for classid in classes:
        flow_class = ["rate", share, "ceil", rate, *bucket]
        commands.append(
            [
                "tc",
                "class",
                "replace",
                "dev",
                intf,
                "parent",
                "1:1",
                "classid",
                classid,
                "htb",
                *flow_class,
            ]
        )
        handle = classid.split(":")[1] + ":"
        commands.append(
            ["tc", "qdisc", "replace", "dev", intf, "parent", classid, "handle", handle, *leaf]
        )
    commands.append(
        [
            "tc",
            "filter",
            "replace",
            "dev",
            intf,
            "parent",
            "1:",
            "protocol",
            "all",
            "prio",
            "1",
            "handle",
            "1",
            "bpf",
            "bytecode",
            flow_hash_bytecode(len(classes)),
        ]
    )
    return commands


def unshaping_commands(intf: str) -> list[list[str]]:
    """Remove the shaper (ignore the error if the interface is already gone)."""
    return [["tc", "qdisc", "del", "dev", intf, "root"]]


def check_command(intf: str) -> list[str]:
    """tc command whose output :func:`check_shaping` reads (iproute2 6.1 prints HTB
    classes as text even with ``-j``, so the text form is what is parsed)."""
    return ["tc", "class", "show", "dev", intf]


_TC_CLASS = re.compile(r"class htb 1:1 .*?\brate (\d+(?:\.\d+)?)([KMGT]?)bit\b")
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def check_shaping(tc_class_output: str, rate_bps: float) -> str | None:
    """None if ``tc class show`` output has HTB class 1:1 at ``rate_bps`` (within the 1%
    that tc's printing rounds to), else a sentence saying what is wrong. No HTB at all is
    what Open vSwitch leaves when it removed the qdisc."""
    match = _TC_CLASS.search(tc_class_output)
    if match is None:
        return "no HTB class 1:1 (the shaper is missing; applied before add-port?)"
    got = float(match.group(1)) * _PREFIX[match.group(2)]
    if abs(got - rate_bps) > rate_bps * 0.01:
        return f"HTB class 1:1 shapes to {got:.0f} bit/s, not {rate_bps:.0f}"
    return None


def qdisc_list_command() -> list[str]:
    """Every qdisc of the namespace, as JSON (what :func:`unshaped` reads)."""
    return ["tc", "-j", "qdisc", "show"]


def unshaped(
    qdiscs: list[dict[str, object]], intfs: list[str], recipe: ShapingRecipe | None = None
) -> list[str]:
    """The interfaces of ``intfs`` (switch side) that lack the recipe's HTB root (handle 1:)
    or its leaf under class 1:1, from ``tc -j qdisc show``. What an Open vSwitch that
    re-added a port (or restarted) leaves: it deletes a root qdisc it finds on a port."""
    recipe = recipe or DEFAULT_RECIPE
    leaf_kind = recipe.leaf(1e6)[0]
    parent = (recipe.flow_classids() or ["1:1"])[0]  # the first (or only) leaf's class
    roots = {q.get("dev") for q in qdiscs if q.get("kind") == "htb" and q.get("handle") == "1:"}
    leaves = {
        q.get("dev") for q in qdiscs if q.get("kind") == leaf_kind and q.get("parent") == parent
    }
    return [intf for intf in intfs if intf not in roots or intf not in leaves]
