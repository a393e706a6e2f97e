"""Units and argument checks shared by every helper module.

Sizes are bytes (int). GiB = 1024**3 bytes and GB = 1000**3 bytes; the two are never mixed in
one number. ``DTYPE_BYTES`` is the one table of number-format names the course uses, with the
bytes one element takes. ``positive_int`` is how every helper validates a count: a ValueError
that names the argument when it is zero, negative or not a whole number.
"""

from __future__ import annotations

import numbers

GIB = 1024**3
GB = 1000**3

#: Bytes per stored element of every number format the course names: full and half precision,
#: the generic 8-bit width ("fp8") and the two float8 formats and int8 of lesson 02.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "e4m3": 1, "e5m2": 1}


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise ValueError naming ``name``.

    Accepts Python and NumPy integers (not bools, not floats). ``allow_zero`` admits 0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    value = int(value)
    smallest = 0 if allow_zero else 1
    if value < smallest:
        rule = "zero or more" if allow_zero else "at least 1"
        raise ValueError(f"{name} must be {rule}, got {value}")
    return value


def bytes_per_element(dtype: str) -> int:
    """Bytes per element of a number format named in DTYPE_BYTES (e.g. 'bf16' -> 2)."""
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        allowed = ", ".join(DTYPE_BYTES)
        raise ValueError(f"dtype must be one of {allowed}; got {dtype!r}") from None


def gib(n_bytes: float) -> float:
    """Bytes -> GiB (1024**3 bytes)."""
    return n_bytes / GIB


def gb(n_bytes: float) -> float:
    """Bytes -> GB (1000**3 bytes)."""
    return n_bytes / GB


def format_bytes(n_bytes: float) -> str:
    """A readable binary size: '512 KiB', '64 GiB', '1.5 MiB' (powers of 1024, at most 2 decimals)."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be zero or more, got {n_bytes}")
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(value, 2) < 1024 or unit == "TiB":  # round first: 1023.999 KiB reads as 1 MiB
            return f"{value:,.2f}".rstrip("0").rstrip(".") + f" {unit}"
        value /= 1024
    raise AssertionError("unreachable")
