"""The one number formatter of every renderer (terminal, Markdown, HTML): µs, counts, per-iteration
rates, percentages.

The kind of number sets the digits (`US`, `COUNT`, `RATE`, `RESIDUAL`); the medium sets only how a
missing value looks (`HYPHEN` on the terminal, `DASH` in documents). Plain text out: the
renderers escape it as their medium needs.
"""

from __future__ import annotations

# digits by kind of number
US = 1  # a time in µs (a mean, a median, a change)
COUNT = 0  # a count per iteration (a median), or a total
RATE = 2  # calls or syncs per iteration (a mean), unprofiled throughput
RESIDUAL = 3  # the decomposition's residual, µs: exact is 0.000

# how a missing value looks
DASH = "–"  # Markdown and HTML
HYPHEN = "-"  # the terminal


def num(x: float | None, digits: int = US, *, sign: bool = False, missing: str = DASH) -> str:
    """`x` with thousands separators and `digits` decimals; `sign`: a ``+`` on a positive value.

    Zero is ``0`` (or ``0.0``…) whatever its sign and `sign`: never ``-0.0``, never ``+0``. With
    no decimals an integral value is written as the integer it is (exact above 2**53).
    """
    if x is None:
        return missing
    if x == 0:
        return "0" if digits == 0 else f"{0:.{digits}f}"
    if digits == 0 and float(x).is_integer():
        return f"{int(x):+,d}" if sign else f"{int(x):,d}"
    return f"{x:+,.{digits}f}" if sign else f"{x:,.{digits}f}"


def pct(x: float | None, *, sign: bool = True, missing: str = DASH) -> str:
    """A percentage with one decimal and thousands separators: ``+3.2%`` (a change), ``41.0%`` (a share,
    ``sign=False``), ``+4,660.6%``."""
    if x is None:
        return missing
    return f"{x:+,.1f}%" if sign else f"{x:,.1f}%"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count and its noun, singular for one: ``1 iteration``, ``8 iterations``, ``1,024 iterations``."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def ratio_pct(ratio: float | None, *, missing: str = DASH) -> str:
    """A ratio candidate / baseline as the change in percent: 1.032 -> ``+3.2%``."""
    return missing if ratio is None else pct((ratio - 1) * 100)
