"""Multi-head latent attention (MLA, DeepSeek-V2) in NumPy: cache a small latent, expand on use.

Per token and layer, MLA caches a latent ``c`` of ``kv_lora_rank`` numbers (the keys' and
values' shared compressed form) and one rotary key of ``qk_rope_head_dim`` numbers shared by
all heads. Keys and values of every head are rebuilt from ``c`` when attention needs them:

    k_h = [c W_uk[h], rope(x W_kr)]      v_h = c W_uv[h]

The rotary part is kept apart because RoPE depends on the position, so it cannot be folded
into W_uk. Shapes: token rows ``x`` (n, d_model); outputs (heads, n_q, d_v).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helpers.attention import causal_mask, softmax
from helpers.units import positive_int


def mla_elements_per_token(kv_lora_rank: int, qk_rope_head_dim: int, layers: int = 1) -> int:
    """Numbers MLA caches per token: (latent + rotary key) per layer, times layers (no factor 2)."""
    return positive_int("layers", layers) * (positive_int("kv_lora_rank", kv_lora_rank)
                                             + positive_int("qk_rope_head_dim", qk_rope_head_dim))


def rope(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding: rotate channel pairs (2i, 2i+1) of x (..., n, d) by position x base^(-2i/d)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope needs an even number of channels, got {d}")
    angles = np.asarray(positions, dtype=np.float64)[:, None] * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(angles), np.sin(angles)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.result_type(x, np.float64))
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@dataclass(frozen=True)
class MLAWeights:
    """The projections of one MLA layer (query compression left out: it does not touch the cache)."""

    w_dkv: np.ndarray  # (d_model, kv_lora_rank): token -> latent
    w_uk: np.ndarray  # (kv_lora_rank, heads, d_nope): latent -> keys without position
    w_uv: np.ndarray  # (kv_lora_rank, heads, d_v): latent -> values
    w_kr: np.ndarray  # (d_model, d_rope): token -> the rotary key shared by all heads
    w_q: np.ndarray  # (d_model, heads, d_nope + d_rope): token -> queries

    @property
    def heads(self) -> int:
        return self.w_uk.shape[1]

    @property
    def elements_per_token(self) -> int:
        """Numbers this layer caches per token: the latent plus the rotary key."""
        return mla_elements_per_token(self.w_dkv.shape[1], self.w_kr.shape[1])

    def queries(self, x: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(q_nope (heads, n, d_nope), q_rope (heads, n, d_rope)) for token rows x (n, d_model)."""
        d_nope = self.w_uk.shape[2]
        q = np.einsum("nm,mhe->hne", x, self.w_q)
        return q[..., :d_nope], rope(q[..., d_nope:], positions)


def random_mla(d_model: int = 64, heads: int = 4, kv_lora_rank: int = 16, d_nope: int = 16,
               d_rope: int = 8, d_v: int = 16, seed: int = 0) -> MLAWeights:
    """Small random MLA weights (scaled 1/sqrt(fan-in)) for demonstrations and tests."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(0.0, shape[0] ** -0.5, shape)

    return MLAWeights(w(d_model, kv_lora_rank), w(kv_lora_rank, heads, d_nope), w(kv_lora_rank, heads, d_v),
                      w(d_model, d_rope), w(d_model, heads, d_nope + d_rope))


def _attend(q_nope, q_rope, k_nope, k_rope, v, causal: bool) -> np.ndarray:
    d = q_nope.shape[-1] + q_rope.shape[-1]
    scores = (np.einsum("hqe,hke->hqk", q_nope, k_nope) + np.einsum("hqe,ke->hqk", q_rope, k_rope)) / np.sqrt(d)
    if causal:
        scores = np.where(causal_mask(q_nope.shape[1], k_nope.shape[1]), scores, -np.inf)
    return np.einsum("hqk,hkv->hqv", softmax(scores), v)


class MLACache:
    """A one-layer MLA cache: appends latents and rotary keys, expands them when attending."""

    def __init__(self, weights: MLAWeights):
        self.w = weights
        self.latent = np.zeros((0, weights.w_dkv.shape[1]))
        self.k_rope = np.zeros((0, weights.w_kr.shape[1]))

    def __len__(self) -> int:
        return len(self.latent)

    def append(self, x: np.ndarray) -> None:
        """Compress token rows x (n, d_model), at the next positions, into the cache."""
        positions = np.arange(len(self), len(self) + len(x))
        self.latent = np.vstack([self.latent, x @ self.w.w_dkv])
        self.k_rope = np.vstack([self.k_rope, rope(x @ self.w.w_kr, positions)])

    def attend(self, x_q: np.ndarray, causal: bool = True) -> np.ndarray:
        """Attention of the last len(x_q) cached tokens' queries, expanding K and V from the latent."""
        positions = np.arange(len(self) - len(x_q), len(self))
        q_nope, q_rope = self.w.queries(x_q, positions)
        k_nope = np.einsum("nc,che->hne", self.latent, self.w.w_uk)
        v = np.einsum("nc,chv->hnv", self.latent, self.w.w_uv)
        return _attend(q_nope, q_rope, k_nope, self.k_rope, v, causal)

    def attend_absorbed(self, x_q: np.ndarray, causal: bool = True) -> np.ndarray:
        """The same attention without ever expanding K or V: W_uk moves onto the query, W_uv after the sum."""
        positions = np.arange(len(self) - len(x_q), len(self))
        q_nope, q_rope = self.w.queries(x_q, positions)
        q_latent = np.einsum("hqe,che->hqc", q_nope, self.w.w_uk)  # query in latent space
        d = q_nope.shape[-1] + q_rope.shape[-1]
        scores = (np.einsum("hqc,kc->hqk", q_latent, self.latent)
                  + np.einsum("hqe,ke->hqk", q_rope, self.k_rope)) / np.sqrt(d)
        if causal:
            scores = np.where(causal_mask(len(x_q), len(self)), scores, -np.inf)
        mixed = np.einsum("hqk,kc->hqc", softmax(scores), self.latent)
        return np.einsum("hqc,chv->hqv", mixed, self.w.w_uv)


def expanded_attention(weights: MLAWeights, x: np.ndarray, n_q: int, causal: bool = True) -> np.ndarray:
    """Reference: keys and values of every head expanded up front (what an ordinary KV cache stores),
    then attention of the last ``n_q`` tokens of x (n, d_model)."""
    positions = np.arange(len(x))
    latent = x @ weights.w_dkv
    k_nope = np.einsum("nc,che->hne", latent, weights.w_uk)
    v = np.einsum("nc,chv->hnv", latent, weights.w_uv)
    k_rope = rope(x @ weights.w_kr, positions)
    q_nope, q_rope = weights.queries(x[len(x) - n_q:], positions[len(x) - n_q:])
    return _attend(q_nope, q_rope, k_nope, k_rope, v, causal)
