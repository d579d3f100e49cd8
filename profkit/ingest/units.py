"""Kineto's microsecond floats -> profkit's integer nanoseconds, converted once at ingest (DESIGN.md).

The whole microseconds are multiplied by 1000 in integers and only the fraction's nanoseconds are
rounded (half to even): `us * 1000` in floating point would lose nanoseconds on epoch timestamps
(~1.7e15 µs, beyond 2**53 once in ns). The C scanner (_scan.c, to_ns) and tables._ns compute the same.
"""

from __future__ import annotations

import math

US_LIMIT = 9.0e15  # |µs| at or beyond this (~285 years) is no time


def us_to_ns(us: float) -> int:
    whole = math.trunc(us)
    return whole * 1000 + round((us - whole) * 1000)
