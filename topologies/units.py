"""Link rates and latencies written the way network people write them: ``200G``, ``25M``,
``3.6T``; ``600ns``, ``0.6us``, ``2ms``.

Rates are bits per second, decimal prefixes (``1G`` = 10**9 bit/s), as on switch data sheets.
Durations are seconds; a bare number is microseconds (the unit latencies are quoted in).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

#: TCP's payload share of a full Ethernet frame as a shaper counts it: a 1500-byte MTU less
#: 20 bytes of IP and 20 of TCP header (no TCP options: the GPUs turn timestamps off) is
#: 1460 bytes of payload in a 1514-byte frame (14 bytes of Ethernet header). The best
#: goodput a TCP flow gets on a link shaped to R is R x TCP_PAYLOAD_SHARE.
TCP_PAYLOAD_SHARE = 1460 / 1514


def tcp_payload_share(mtu: int = 1500) -> float:
    """:data:`TCP_PAYLOAD_SHARE` for frames of ``mtu`` bytes (an emulator recipe may
    enlarge the frames: orchestrator.emulation.recipe, ``jumbo-packets``)."""
    return (mtu - 40) / (mtu + 14)


_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
#: What :func:`parse_rate` reads in a text (the JSON Schemas say the same, topologies/schema.py).
RATE = re.compile(
    r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([KMGT]?)(?:bit/s|bps|b/s)?\s*$", re.IGNORECASE
)
#: A plain number written as text, which a number key also takes: PyYAML reads YAML 1.1,
#: where ``1e-4`` (no dot) is a string, not a float.
NUMBER_TEXT = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$")


def parse_rate(text: object) -> float:
    """Return the rate in bit/s for ``200G``, ``3.6T``, ``25M``, ``100Mbps`` or a bare number.

    Raises ``ValueError`` with the accepted forms for anything else (the spec loader turns
    it into a message that names the file and key). YAML's ``.inf`` and ``.nan`` are
    floats, and ``1e999G`` overflows to infinity: none is a rate (an infinite link makes
    max-flow unbounded, a NaN one turns every capacity and ceiling derived from it to NaN).
    """
    if isinstance(text, bool):
        raise ValueError("a rate such as 200G, 25M or 3.6T")
    if isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:  # an integer beyond any float
            value = math.inf
    elif isinstance(text, str) and (match := RATE.match(text)):
        value = float(match.group(1)) * _PREFIX[match.group(2).upper()]
    else:
        raise ValueError("a rate such as 200G, 25M or 3.6T")
    if not math.isfinite(value):
        raise ValueError("a finite rate such as 200G, 25M or 3.6T")
    if value <= 0:
        raise ValueError("a positive rate")
    return value


def format_rate(bps: float) -> str:
    """``2e11`` -> ``'200G'``; ``2.5e7`` -> ``'25M'``; the shortest faithful spelling."""
    for prefix in ("T", "G", "M", "K"):
        scale = _PREFIX[prefix]
        if bps >= scale:
            value = bps / scale
            text = f"{value:.3f}".rstrip("0").rstrip(".")
            return f"{text}{prefix}"
    return f"{bps:.0f}"


# decimal exponents, so that "6.6us" is the float nearest 6.6e-06 (it reads back equal)
_DURATION_EXPONENT = {"ns": -9, "us": -6, "\u00b5s": -6, "ms": -3, "s": 0}
#: The unit of a duration written as a bare number: latencies are quoted in microseconds.
BARE_DURATION_UNIT = "us"
#: What :func:`parse_duration` reads in a text (without a unit: BARE_DURATION_UNIT).
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(ns|us|\u00b5s|ms|s)?\s*$")
_DURATION_FORMS = "a duration such as 600ns, 0.6us or 2ms (a bare number is microseconds)"


def parse_duration(text: object) -> float:
    """Return seconds for ``600ns``, ``0.6us`` (or ``0.6\u00b5s``), ``2ms``, ``1s`` or a bare
    number of microseconds; zero is allowed (a component that adds nothing).

    Raises ``ValueError`` with the accepted forms for anything else.
    """
    if isinstance(text, bool):
        raise ValueError(_DURATION_FORMS)
    if isinstance(text, (int, float)):
        if text < 0 or text != text:
            raise ValueError("a duration >= 0")
        return _seconds(repr(float(text)), _DURATION_EXPONENT[BARE_DURATION_UNIT])
    if not isinstance(text, str):
        raise ValueError(_DURATION_FORMS)
    match = DURATION.match(text)
    if not match:
        raise ValueError(_DURATION_FORMS)
    return _seconds(match.group(1), _DURATION_EXPONENT[match.group(2) or BARE_DURATION_UNIT])


def _seconds(number: str, exponent: int) -> float:
    return float(Decimal(number).scaleb(exponent))


def bare_duration(seconds: float) -> float:
    """``seconds`` written as a bare number (of BARE_DURATION_UNIT): ``1e-3`` -> ``1000.0``."""
    return _seconds(repr(seconds), -_DURATION_EXPONENT[BARE_DURATION_UNIT])


def format_duration(seconds: float) -> str:
    """``6e-07`` -> ``'0.6us'``; ``0.0167`` -> ``'16.7ms'``: microseconds below 1 ms, then
    milliseconds, then seconds, with at most three decimals (parse_duration reads it back)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3f}".rstrip("0").rstrip(".") + unit
    return f"{seconds / 1e-6:.3f}".rstrip("0").rstrip(".") + "us"
