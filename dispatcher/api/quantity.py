"""Kubernetes resource quantities parsed exactly. Pure, no I/O.

Every quantity is held as an integer count of milli-units (cpu "500m" -> 500,
memory "1Ki" -> 1_024_000). Integers keep the arithmetic exact: adding and
subtracting thousands of pod requests never drifts, which matters because the
fit check compares sums against allocatable to the last unit. Values finer
than a milli-unit are rounded up, as the scheduler does for requests.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation

_BINARY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# Bounds that keep parsing exact and cheap: Decimal arithmetic under _EXACT is exact for any
# input within them, and nothing real comes near 10**27 units (8Ei of memory is ~9.2e18 bytes).
_MAX_DIGITS = 40
_MAX_EXPONENT_DIGITS = 4
_MAX_MILLI = 10**30
_EXACT = Context(prec=200, rounding=ROUND_CEILING)
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?\d+))?$",
    # ASCII: in a str pattern \d matches any Unicode digit ("٢Gi" would read as 2Gi, which
    # Kubernetes refuses), so the dispatcher would reserve for pods that can never exist.
    re.ASCII,
)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says which and why."""


def parse_milli(value: str | int | float) -> int:
    """Return the quantity as an integer number of milli-units.

    Raises QuantityError for anything Kubernetes would reject (e.g. "4 GB", "1.5.2", "-1"),
    and for values too large to be real (10**27 units and more).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise QuantityError(f"quantity must be a number or string, not {value!r}")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"malformed quantity {value!r}: expected a number with an optional suffix "
            "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent, e.g. 500m, 16Gi, 1e3"
        )
    digits = match["number"]
    exponent = match["exponent"]
    if len(digits) > _MAX_DIGITS or (exponent is not None and len(exponent) > _MAX_EXPONENT_DIGITS):
        raise QuantityError(f"quantity {value!r} is out of range")
    try:
        number = Decimal(digits)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"malformed quantity {value!r}") from exc
    if number < 0:
        raise QuantityError(f"quantity {value!r} is negative; requests must be >= 0")
    suffix = match["suffix"]
    if exponent is not None:
        scaled = number.scaleb(int(exponent) + 3, _EXACT)
    elif suffix in _BINARY_SUFFIXES:
        scaled = _EXACT.multiply(number, _BINARY_SUFFIXES[suffix] * 1000)
    else:
        scaled = _EXACT.multiply(number, _DECIMAL_SUFFIXES[suffix or ""] * 1000)
    if scaled > _MAX_MILLI:
        raise QuantityError(f"quantity {value!r} is out of range")
    return int(scaled.to_integral_value(rounding=ROUND_CEILING, context=_EXACT))


def _is_bytes(resource: str) -> bool:
    return resource == "memory" or resource.startswith(("ephemeral-storage", "hugepages-"))


_BYTE_SUFFIXES = (
    *sorted(_BINARY_SUFFIXES.items(), key=lambda item: -item[1]),
    *((suffix, int(size)) for suffix, size in _DECIMAL_SUFFIXES.items() if size > 1),
)


def format_milli(milli: int, resource: str = "") -> str:
    """Render milli-units for people: cpu as cores or millicores, bytes with a suffix.

    Byte quantities take their shortest exact form, binary suffixes winning ties, so the
    "16G" a user wrote reads back as 16G and 2**30 bytes as 1Gi.
    """
    if milli % 1000:
        return f"{milli}m"
    units = milli // 1000
    if units and _is_bytes(resource):
        forms = [f"{units // size}{suffix}" for suffix, size in _BYTE_SUFFIXES if units % size == 0]
        return min([*forms, str(units)], key=len)
    return str(units)
