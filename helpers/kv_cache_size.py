"""How many bytes a KV cache holds: the per-token formula and what follows from it.

All sizes are in bytes (int). GiB = 1024**3 bytes, GB = 1000**3 bytes; the two are
never mixed. Every function validates its arguments and raises ValueError naming the
argument when a size is zero, negative or not a whole number.
"""

from __future__ import annotations

from helpers.mla import mla_elements_per_token
from helpers.units import bytes_per_element, positive_int


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


LAYOUTS = ("MHA", "GQA", "MQA", "MLA")


def layout_bytes_per_token(layout: str, group: int = 4, storage: str = "bf16", layers: int = 32, q_heads: int = 32,
                           head_dim: int = 128) -> int:
    """Bytes per token of one shape (default Llama-2-7B's: 32 layers, 32 query heads, head dim 128)
    in each attention layout, stored as ``storage`` (a name in ``helpers.units.DTYPE_BYTES``).

    MHA: a K/V head per query head; GQA: query heads in groups of ``group`` share one; MQA: one for
    all; MLA with DeepSeek-V2's proportions: a latent of 4 x head_dim plus a rotary key of head_dim / 2.
    """
    bpe = bytes_per_element(storage)
    if layout == "MLA":
        return mla_elements_per_token(4 * head_dim, head_dim // 2, layers) * bpe
    kv_heads = {"MHA": q_heads, "MQA": 1}.get(layout)
    if layout == "GQA":
        if group < 1 or q_heads % group:
            raise ValueError(f"group must divide {q_heads} query heads; got {group}")
        kv_heads = q_heads // group
    if kv_heads is None:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    return kv_bytes_per_token(layers, kv_heads, head_dim, bpe)
