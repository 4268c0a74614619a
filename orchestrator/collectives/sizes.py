"""Message sizes as people write them (``64K``, ``1M``, ``2GiB``): binary prefixes, as
nccl-tests reads its ``-b``/``-e`` arguments."""

from __future__ import annotations

import re

#: What :func:`parse_size` reads in a text (the experiment schema says the same).
SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
MIN_SIZE = 1  # byte
#: The largest size, 2^53 bytes (8192T = 8 PiB): the largest count a double holds to the
#: byte. The forecast plays bytes out and the results divide them in doubles; far beyond
#: (10^309 bytes) a size is not a double at all, and the forecast would fail on it.
MAX_SIZE = 1 << 53
#: A size's binary prefixes (K = 1024 bytes, as nccl-tests reads them) and their units.
BINARY_PREFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: object) -> int:
    """Bytes for ``1M``, ``64K``, ``512``, ``2GiB`` or a bare integer (1K = 1024, as nccl-tests).

    Raises ``ValueError`` naming the accepted forms.
    """
    if isinstance(text, bool):
        raise ValueError("a size in bytes such as 512, 64K or 1M")
    if isinstance(text, int):
        value = text
    elif isinstance(text, str) and (match := SIZE.match(text)):
        value = int(match.group(1)) * BINARY_PREFIXES[match.group(2).upper()]
    else:
        raise ValueError("a size in bytes such as 512, 64K or 1M")
    if value < MIN_SIZE:
        raise ValueError("a size of at least 1 byte")
    if value > MAX_SIZE:
        raise ValueError(
            f"a size of at most {format_size(MAX_SIZE)} (2^53 bytes, the most a double "
            "counts to the byte)"
        )
    return value


def format_size(size: int) -> str:
    """``1048576`` -> ``'1M'``, ``65536`` -> ``'64K'``, ``1000`` -> ``'1000'`` (exact only)."""
    for prefix in ("T", "G", "M", "K"):
        unit = BINARY_PREFIXES[prefix]
        if size >= unit and size % unit == 0:
            return f"{size // unit}{prefix}"
    return str(size)
