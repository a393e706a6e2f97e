"""Skipping layers of the KV cache: adjacent layers that share one cache.

Two ways for the layer pairs (l, l + 1) from ``first_layer`` up to hold about one layer's cache:

- ``share`` (cross-layer attention, CLA, at inference): the upper layer computes no keys and
  values of its own and attends over the lower layer's. CLA trains the model that way; applied to
  a model trained without it, as here, it measures how different adjacent layers' caches are.
- ``slerp`` (MiniCache): each token's key (and value) in the two layers is split into a length and
  a direction; the two directions are interpolated halfway along the sphere, and each layer keeps
  its own length, so a pair stores one direction plus two lengths. MiniCache also keeps the tokens
  whose directions disagree most unmerged; this version merges every token.

``CrossLayerCache`` stores the merged rows in both layers' slots (so the model reads them as
usual) and ``stored_bytes`` counts what a real implementation would hold.
"""

from __future__ import annotations

import torch

from helpers.llama import KVCache, LlamaConfig
from helpers.units import positive_int

SHARING_MODES = ("share", "slerp")


def slerp(a: torch.Tensor, b: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    """Unit vectors (..., d) a fraction ``t`` of the way along the great circle from a's direction
    to b's (a and b need not be unit length; parallel or zero vectors give a's direction)."""
    if not 0 <= t <= 1:
        raise ValueError(f"t must lie in [0, 1]; got {t}")
    ua, ub = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
    angle = (ua * ub).sum(-1, keepdim=True).clamp(-1, 1).acos()
    sin = angle.sin()
    straight = sin < 1e-6  # (anti)parallel: no unique great circle; keep a's direction
    wa = torch.where(straight, 1.0, ((1 - t) * angle).sin() / sin.clamp_min(1e-6))
    wb = torch.where(straight, 0.0, (t * angle).sin() / sin.clamp_min(1e-6))
    return torch.nn.functional.normalize(wa * ua + wb * ub, dim=-1)


def layer_pairs(n_layers: int, first_layer: int) -> list[tuple[int, int]]:
    """Adjacent pairs (l, l + 1) from ``first_layer`` to the top of an ``n_layers``-layer model."""
    n_layers = positive_int("n_layers", n_layers)
    if not 0 <= first_layer < n_layers - 1:
        raise ValueError(f"first_layer must lie in 0 .. {n_layers - 2} for a {n_layers}-layer model; got {first_layer}")
    return [(layer, layer + 1) for layer in range(first_layer, n_layers - 1, 2)]


class CrossLayerCache(KVCache):
    """A KVCache whose layer pairs from ``first_layer`` up share one cache (``mode``: share or slerp).

    ``share`` replaces the upper layer's new keys and values with the lower layer's as they are
    appended, so every query of the upper layer, the current token's included, reads the lower
    layer's. ``slerp`` merges a pass's new rows once the pass ends: the tokens of the current
    forward pass attend over their own unmerged rows, every earlier token over merged ones.
    """

    def __init__(self, config: LlamaConfig, mode: str, first_layer: int, capacity: int):
        if mode not in SHARING_MODES:
            raise ValueError(f"mode must be one of {', '.join(SHARING_MODES)}; got {mode!r}")
        super().__init__(config, batch=1, capacity=capacity)
        self.mode, self.pairs = mode, layer_pairs(config.layers, first_layer)
        self.upper = {upper: lower for lower, upper in self.pairs}

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "share" and layer in self.upper:  # the lower layer wrote these rows earlier in this pass
            rows = slice(self.length, self.length + k.shape[2])
            lower = self.upper[layer]
            k, v = self.keys[lower, :, :, rows], self.values[lower, :, :, rows]
        return super().append(layer, k, v)

    def advance(self, attention=None) -> None:
        rows = slice(self.length, self.length + self._pending)
        super().advance(attention)
        if self.mode != "slerp":
            return
        for lower, upper in self.pairs:
            for store in (self.keys, self.values):
                a, b = store[lower, :, :, rows], store[upper, :, :, rows]
                direction = slerp(a, b)
                store[lower, :, :, rows] = direction * a.norm(dim=-1, keepdim=True)
                store[upper, :, :, rows] = direction * b.norm(dim=-1, keepdim=True)

    def stored_bytes(self) -> int:
        """Bytes a real implementation holds: one layer's keys and values per pair (plus, for slerp,
        a float32 length per token, K/V head and layer of the pair), full layers elsewhere."""
        layers, _, kv_heads, _, head_dim = self.keys.shape
        per_layer = 2 * kv_heads * self.length * head_dim * self.keys.element_size()
        lengths = 2 * 2 * kv_heads * self.length * 4 if self.mode == "slerp" else 0
        return (layers - len(self.pairs)) * per_layer + len(self.pairs) * lengths
