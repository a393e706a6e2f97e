"""Attention without the n x n table: FlashAttention's tiled forward pass in NumPy.

Shapes: q (..., n_q, d), k and v (..., n_k, d); leading (batch, head) axes broadcast. With
``causal=True``, query i sits at absolute position n_k - n_q + i and sees keys 0 .. that
position (the alignment decoding and chunked prefill need; n_q == n_k is the usual triangle).

``naive_attention`` writes the whole score table S and probability table P, as standard
attention does. ``flash_attention`` follows Algorithm 1 of Dao et al. 2022 (arXiv 2205.14135):
an outer loop over blocks of K and V, an inner loop over blocks of Q, and for each pair the
online-softmax update of the running row maximum m, the running sum l and the output O. It
returns the output and each row's log-sum-exp (lse = m + log l), which is what lets partial
results over different keys be merged (``merge_partials``).

Both can count the elements they read from and write to "HBM" (main memory), for one
(batch, head) slice, in a dict passed as ``traffic``; ``standard_traffic`` and ``flash_traffic``
give the same counts in closed form.
"""

from __future__ import annotations

import math

import numpy as np

from helpers.attention import causal_mask, visible
from helpers.units import positive_int


def _check(q, k, v, causal: bool):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            raise ValueError(f"{name} must be a NumPy array of shape (..., n, d), got {type(x).__name__} "
                             f"of shape {getattr(x, 'shape', None)}")
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{name} must hold floating-point numbers, got dtype {x.dtype}")
        if x.shape[-2] < 1 or x.shape[-1] < 1:
            raise ValueError(f"{name} must have at least one row and one column, got shape {x.shape}")
    if k.shape[-2:] != v.shape[-2:]:
        raise ValueError(f"k and v must have the same (n_k, d), got {k.shape[-2:]} and {v.shape[-2:]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim d, got {q.shape[-1]} and {k.shape[-1]}")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"leading axes of q {q.shape[:-2]}, k {k.shape[:-2]} and v {v.shape[:-2]} "
                         "do not broadcast") from None
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal attention needs n_q <= n_k, got n_q={q.shape[-2]} and n_k={k.shape[-2]}")


def _count(traffic: dict | None, key: str, elements: int) -> None:
    if traffic is not None:
        traffic[key] = traffic.get(key, 0) + int(elements)


def naive_attention(q, k, v, causal: bool = False, traffic: dict | None = None) -> np.ndarray:
    """Standard attention: S = q k^T / sqrt(d) and P = softmax(S) are whole (n_q, n_k) tables."""
    _check(q, k, v, causal)
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    dtype = np.result_type(q, k, v)
    scores = (q @ np.swapaxes(k, -1, -2)).astype(dtype, copy=False) / np.asarray(math.sqrt(d), dtype)
    if causal:
        scores = np.where(causal_mask(n_q, n_k), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs @ v
    # Per (batch, head): read Q, K; write S; read S; write P; read P, V; write O.
    _count(traffic, "read", n_q * d + n_k * d + n_q * n_k + n_q * n_k + n_k * d)
    _count(traffic, "write", n_q * n_k + n_q * n_k + n_q * d)
    return out


def block_update(m, l, o, scores, v_block):
    """One step of the online softmax (Algorithm 1, lines 10-12) for a block of rows.

    m, l: (..., rows) running maximum and sum; o: (..., rows, d) output so far (normalised);
    scores: (..., rows, cols) this block's scores, -inf where masked; v_block: (..., cols, d).
    Returns the new (m, l, o). Rows that have seen no visible key yet keep m = -inf, l = 0, o = 0.
    """
    m_tilde = scores.max(axis=-1)  # the block's own row maximum
    m_new = np.maximum(m, m_tilde)
    finite = np.isfinite(m_new)  # False only while a row has seen nothing but masked keys
    safe = np.where(finite, m_new, 0)
    seen = np.isfinite(m_tilde)  # False for a row whose keys in this block are all masked
    p_tilde = np.exp(scores - np.where(seen, m_tilde, 0)[..., None])  # exp(-inf) = 0 where masked
    l_tilde = p_tilde.sum(axis=-1)
    alpha = np.where(finite, np.exp(m - safe), 0)  # rescales what was summed against the old max
    beta = np.where(finite, np.exp(m_tilde - safe), 0)  # rescales this block's sum
    l_new = alpha * l + beta * l_tilde
    denom = np.where(l_new > 0, l_new, 1)
    o_new = ((alpha * l)[..., None] * o + beta[..., None] * (p_tilde @ v_block)) / denom[..., None]
    return m_new, l_new, o_new


def flash_attention(q, k, v, block_q: int = 64, block_k: int = 64, causal: bool = False,
                    traffic: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tiled attention (FlashAttention Algorithm 1): (out (..., n_q, d), lse (..., n_q)).

    Blocks need not divide n_q or n_k (the last block is shorter). Equal to ``naive_attention``
    up to floating-point rounding; no (n_q, n_k) table is ever formed.
    """
    _check(q, k, v, causal)
    block_q, block_k = positive_int("block_q", block_q), positive_int("block_k", block_k)
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    dtype = np.result_type(q, k, v)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    scale = np.asarray(1 / math.sqrt(d), dtype)
    out = np.zeros(batch + (n_q, d), dtype)  # O = 0, l = 0, m = -inf "in HBM"
    l = np.zeros(batch + (n_q,), dtype)
    m = np.full(batch + (n_q,), -np.inf, dtype)
    _count(traffic, "write", n_q * (d + 2))
    visit = tile_mask(n_q, n_k, block_q, block_k, causal)  # the tiles the schedule computes
    for j0 in range(0, n_k, block_k):  # outer loop: one block of K and V at a time
        cols = np.arange(j0, min(j0 + block_k, n_k))
        k_j, v_j = k[..., cols, :], v[..., cols, :]
        _count(traffic, "read", 2 * len(cols) * d)
        for i0 in range(0, n_q, block_q):  # inner loop: every block of Q meets this block of K, V
            if not visit[i0 // block_q, j0 // block_k]:
                continue  # the whole block is in the future of every query in it
            rows = np.arange(i0, min(i0 + block_q, n_q))
            s = (q[..., rows, :] @ np.swapaxes(k_j, -1, -2)).astype(dtype, copy=False) * scale
            if causal:
                s = np.where(visible(rows, cols, n_q, n_k), s, -np.inf)
            m[..., rows], l[..., rows], out[..., rows, :] = block_update(
                m[..., rows], l[..., rows], out[..., rows, :], s, v_j)
            _count(traffic, "read", len(rows) * (2 * d + 2))  # Q_i, O_i, l_i, m_i
            _count(traffic, "write", len(rows) * (d + 2))  # O_i, l_i, m_i
    return out, m + np.log(l)


def merge_partials(out_a, lse_a, out_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """Combine attention over two disjoint key ranges into attention over their union.

    Each part is (out (..., n_q, d), lse (..., n_q)); a part with lse = -inf saw no keys. This is
    the reduction Flash-Decoding runs after splitting a long cache across workers.
    """
    out_a, out_b, lse_a, lse_b = map(np.asarray, (out_a, out_b, lse_a, lse_b))
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(f"parts must have matching shapes: out {out_a.shape} and {out_b.shape}, "
                         f"lse {lse_a.shape} and {lse_b.shape} (lse is out without its last axis)")
    lse = np.logaddexp(lse_a, lse_b)
    finite = np.isfinite(lse)
    safe = np.where(finite, lse, 0)
    w_a = np.where(finite, np.exp(lse_a - safe), 0)[..., None]
    w_b = np.where(finite, np.exp(lse_b - safe), 0)[..., None]
    return w_a * out_a + w_b * out_b, lse


# ---- memory traffic in closed form -------------------------------------------------------
def flash_blocks(sram_elements: int, d: int) -> tuple[int, int]:
    """Algorithm 1's block sizes for an SRAM of M elements: (B_r, B_c) = (min(ceil(M/4d), d), ceil(M/4d))."""
    m, d = positive_int("sram_elements", sram_elements), positive_int("d", d)
    b_c = math.ceil(m / (4 * d))
    return min(b_c, d), b_c


def standard_traffic(n: int, d: int) -> int:
    """Elements standard attention moves to and from HBM for n queries and keys: 4 n d + 4 n^2."""
    n, d = positive_int("n", n), positive_int("d", d)
    return 4 * n * d + 4 * n * n


def tile_mask(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False) -> np.ndarray:
    """Boolean (Q blocks, K/V blocks): True for the tiles Algorithm 1 computes (causal: skips
    tiles whose every key lies after every query of the block)."""
    n_q, n_k = positive_int("n_q", n_q), positive_int("n_k", n_k)
    block_q, block_k = positive_int("block_q", block_q), positive_int("block_k", block_k)
    first_key = np.arange(0, n_k, block_k)
    last_query = np.minimum(np.arange(block_q, n_q + block_q, block_q), n_q) - 1 + (n_k - n_q)
    if not causal:
        return np.ones((len(last_query), len(first_key)), dtype=bool)
    return first_key[None, :] <= last_query[:, None]


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False) -> list[tuple[int, int]]:
    """The (Q block, K/V block) pairs Algorithm 1 visits, in order (outer K/V, inner Q)."""
    mask = tile_mask(n_q, n_k, block_q, block_k, causal)
    return [(int(i), int(j)) for j, i in np.argwhere(mask.T)]


def flash_traffic(n: int, d: int, block_q: int, block_k: int, causal: bool = False) -> int:
    """Elements Algorithm 1 moves to and from HBM for n queries and keys.

    Writes O, l, m once to start (n (d + 2)); reads each K and V block once (2 n d); and for
    every visited tile reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i: rows x (3 d + 4).
    Without the causal skip that is 2 n d + n (d + 2) + ceil(n / B_c) n (3 d + 4), which is
    Theta(n^2 d^2 / M) when B_c is about M / 4d.
    """
    mask = tile_mask(n, n, block_q, block_k, causal)
    rows_per_block = np.minimum(np.arange(block_q, n + block_q, block_q), n) - np.arange(0, n, block_q)
    rows = int((mask.sum(axis=1) * rows_per_block).sum())
    return n * (d + 2) + 2 * n * positive_int("d", d) + rows * (3 * d + 4)


def extra_memory(n: int, d: int, block_q: int, block_k: int, bytes_per_element: int = 2) -> tuple[int, int]:
    """Bytes each algorithm needs beyond Q, K, V and O: (standard: the S and P tables,
    flash: l and m in HBM plus one Q, K, V block and one score tile in SRAM), at ``bytes_per_element``."""
    return 2 * n * n * bytes_per_element, (2 * n + block_q * d + 2 * block_k * d + block_q * block_k) * bytes_per_element


def demo_row(n: int = 32, d: int = 4, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Scores (n,) that rise in a later block (so the maximum moves) and values (n, d)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 1.0, n)
    scores[int(0.6 * n)] += 4.0  # a late, large score: the running maximum must jump
    return scores, rng.normal(0, 1.0, (n, d))


def online_states(scores: np.ndarray, values: np.ndarray, block: int) -> list[dict]:
    """State after 0, 1, 2, ... blocks: m, l, output o, and alpha = exp(m_old - m_new) of that step."""
    block = positive_int("block", block)
    m, l, o = np.full(1, -np.inf), np.zeros(1), np.zeros((1, values.shape[1]))
    states = [{"m": -math.inf, "l": 0.0, "o": o[0].copy(), "alpha": math.nan, "end": 0}]
    for start in range(0, len(scores), block):
        end = min(start + block, len(scores))
        old = m[0]
        m, l, o = block_update(m, l, o, scores[None, start:end], values[start:end])
        alpha = math.exp(old - m[0]) if math.isfinite(old) else 0.0
        states.append({"m": float(m[0]), "l": float(l[0]), "o": o[0].copy(), "alpha": alpha, "end": end})
    return states
