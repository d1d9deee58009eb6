"""Numbers as the tables and sentences print them: fixed decimals, and significant digits for tiny ones.

A mean, sd or interval end of 1e-6 nats (the testbed's effects are that small) would print as ±0.0000 at
four decimals, which reads as "no effect, no spread". A nonzero value that fixed decimals would round to
zero is printed in scientific notation with three significant digits instead; zero stays 0.0000.
"""

from __future__ import annotations

import math

DIGITS = 4  # reference figures are quoted to 1e-4 nats
SIGNIFICANT = 3  # significant digits of a value too small for DIGITS decimals


def figure(value, signed: bool = True, digits: int = DIGITS, latex: bool = False) -> str:
    """`value` at `digits` decimals (with its sign when `signed`), in scientific notation when those decimals
    would show a nonzero value as zero; "–" for None or NaN. `latex`: a LaTeX math-mode power of ten."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    sign = "+" if signed else ""
    if value != 0 and abs(value) < 0.5 * 10.0 ** -digits:
        text = f"{value:{sign}.{SIGNIFICANT - 1}e}"
        if latex:
            mantissa, exponent = text.split("e")
            return f"{mantissa}\\times10^{{{int(exponent)}}}"
        return text
    return f"{value:{sign}.{digits}f}"
