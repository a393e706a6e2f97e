"""How much key/value projection work generation does, with and without a KV cache.

Generation of ``new_tokens`` tokens after a prompt of ``prompt_len`` tokens takes
``new_tokens`` forward passes. Pass s (s = 1 .. new_tokens) sees ``prompt_len + s - 1``
tokens. Without a cache every pass projects every token it sees to a key and a value, in
every layer. With a cache, the first pass (prefill) projects the prompt and each later pass
projects only the one newest token.

Counts are "token projections": one token turned into its key and value in one layer.
"""

from __future__ import annotations

import numpy as np

from helpers.units import positive_int


def kv_projections_per_step(prompt_len: int, new_tokens: int, layers: int, cached: bool) -> np.ndarray:
    """Token projections done in each forward pass; shape (new_tokens,), dtype int64."""
    prompt_len = positive_int("prompt_len", prompt_len)
    new_tokens = positive_int("new_tokens", new_tokens)
    layers = positive_int("layers", layers)
    seen = prompt_len + np.arange(new_tokens, dtype=np.int64)  # tokens the pass sees
    if cached:
        per_pass = np.ones(new_tokens, dtype=np.int64)
        per_pass[0] = prompt_len
    else:
        per_pass = seen
    return per_pass * layers


def kv_projections_total(prompt_len: int, new_tokens: int, layers: int, cached: bool) -> int:
    """Token projections over the whole generation, in closed form.

    Without a cache: layers * (new_tokens * prompt_len + new_tokens * (new_tokens - 1) / 2), O(n^2).
    With a cache: layers * (prompt_len + new_tokens - 1), O(n).
    """
    p = positive_int("prompt_len", prompt_len)
    n = positive_int("new_tokens", new_tokens)
    layers = positive_int("layers", layers)
    if cached:
        return layers * (p + n - 1)
    return layers * (n * p + n * (n - 1) // 2)
