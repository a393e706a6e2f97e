"""Exact attention in NumPy: softmax, multi-head, grouped-query and multi-query attention.

Shapes: queries ``q`` are (q_heads, n_q, head_dim); keys ``k`` and values ``v`` are
(kv_heads, n_kv, head_dim). Query head h reads K/V head h // (q_heads // kv_heads), so
kv_heads == q_heads is multi-head attention (MHA), kv_heads == 1 is multi-query attention
(MQA), and anything between is grouped-query attention (GQA).

With ``causal=True`` the mask is aligned to the end: query i (of n_q) sits at absolute
position n_kv - n_q + i and sees keys 0 .. that position. That is right both for a whole
sequence (n_q == n_kv) and for decoding one new token against a cache (n_q == 1).
"""

from __future__ import annotations

import numpy as np


def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, with the row maximum subtracted first so exp cannot overflow."""
    shifted = scores - np.max(scores, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def visible(rows: np.ndarray, cols: np.ndarray, n_q: int, n_kv: int) -> np.ndarray:
    """Boolean (len(rows), len(cols)): may query ``rows[i]`` see key ``cols[j]``? The n_q queries are
    the last n_q of the n_kv positions (end-aligned): query i sits at position n_kv - n_q + i."""
    return cols[None, :] <= rows[:, None] + (n_kv - n_q)


def causal_mask(n_q: int, n_kv: int) -> np.ndarray:
    """Boolean (n_q, n_kv): True where query i, at position n_kv - n_q + i, may attend to key j."""
    if n_q > n_kv:
        raise ValueError(f"n_q ({n_q}) cannot exceed n_kv ({n_kv}) for a causal mask")
    return visible(np.arange(n_q), np.arange(n_kv), n_q, n_kv)


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise ValueError(f"{name} must be a NumPy array, got {type(x).__name__}")
        if np.ndim(x) != 3:
            raise ValueError(f"{name} must have 3 dimensions (heads, tokens, head_dim), got shape {np.shape(x)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[2]} and {k.shape[2]}")
    if k.shape[0] == 0 or q.shape[0] % k.shape[0]:
        raise ValueError(f"q_heads ({q.shape[0]}) must be a multiple of kv_heads ({k.shape[0]})")


def grouped_query_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
                            return_weights: bool = False):
    """Attention where groups of query heads share one K/V head.

    q (q_heads, n_q, d), k and v (kv_heads, n_kv, d) -> output (q_heads, n_q, d); with
    ``return_weights`` also the attention weights (q_heads, n_q, n_kv).
    """
    _check_shapes(q, k, v)
    q_heads, n_q, d = q.shape
    kv_heads, n_kv, _ = k.shape
    group = q_heads // kv_heads
    # View the query heads as (kv_heads, group): each group meets its own K/V head, no copies.
    qg = q.reshape(kv_heads, group, n_q, d)
    scores = np.einsum("hgqd,hkd->hgqk", qg, k) / np.sqrt(d)
    if causal:
        scores = np.where(causal_mask(n_q, n_kv), scores, -np.inf)
    weights = softmax(scores)
    out = np.einsum("hgqk,hkd->hgqd", weights, v).reshape(q_heads, n_q, d)
    return (out, weights.reshape(q_heads, n_q, n_kv)) if return_weights else out


def multi_head_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """Classic MHA, one K/V head per query head, computed head by head: the reference."""
    _check_shapes(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"MHA needs as many K/V heads as query heads, got {k.shape[0]} and {q.shape[0]}")
    outs = []
    for h in range(q.shape[0]):
        scores = q[h] @ k[h].T / np.sqrt(q.shape[2])
        if causal:
            scores = np.where(causal_mask(q.shape[1], k.shape[1]), scores, -np.inf)
        outs.append(softmax(scores) @ v[h])
    return np.stack(outs)
