"""How many bytes a KV cache holds: the per-token formula and what follows from it.

All sizes are in bytes (int). GiB = 1024**3 bytes, GB = 1000**3 bytes; the two are
never mixed. Every function validates its arguments and raises ValueError naming the
argument when a size is zero, negative or not a whole number.
"""

from __future__ import annotations

import numbers

GIB = 1024**3
GB = 1000**3

#: Bytes per stored element for the number formats the course uses.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


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


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int = 2) -> int:
    """Bytes one token adds to the cache: 2 (K and V) x layers x kv_heads x head_dim x bytes."""
    return (
        2
        * positive_int("layers", layers)
        * positive_int("kv_heads", kv_heads)
        * positive_int("head_dim", head_dim)
        * positive_int("bytes_per_element", bytes_per_element)
    )


def cache_bytes(tokens: int, per_token: int, batch: int = 1) -> int:
    """Bytes of the cache for ``batch`` sequences of ``tokens`` tokens each, at ``per_token`` bytes."""
    return positive_int("tokens", tokens, allow_zero=True) * positive_int("per_token", per_token) * positive_int("batch", batch)


def append_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_element: int = 2, batch: int = 1) -> tuple[int, int]:
    """Bytes written by one decode step: (into each layer, into all layers), for the whole batch.

    Each layer appends one key and one value row of kv_heads x head_dim elements per sequence.
    """
    total = kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element) * positive_int("batch", batch)
    return total // layers, total


def crossover_tokens(weight_bytes: int, per_token: int, batch: int = 1) -> int:
    """Smallest token count at which the cache of ``batch`` sequences holds more bytes than the weights."""
    weight_bytes = positive_int("weight_bytes", weight_bytes)
    step = positive_int("per_token", per_token) * positive_int("batch", batch)
    return weight_bytes // step + 1


def tokens_that_fit(budget_bytes: int, weight_bytes: int, per_token: int, batch: int = 1) -> int:
    """Most tokens per sequence whose cache, for ``batch`` sequences, fits beside the weights.

    0 when the weights alone fill the budget.
    """
    spare = positive_int("budget_bytes", budget_bytes) - positive_int("weight_bytes", weight_bytes, allow_zero=True)
    return max(0, spare // (positive_int("per_token", per_token) * positive_int("batch", batch)))


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
