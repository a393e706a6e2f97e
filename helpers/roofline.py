"""Chips, the roofline, and the speed limit of decoding.

A step that does F floating-point operations and moves B bytes takes at least
max(F / peak FLOP/s, B / bandwidth). Decode steps do about one FLOP per byte, far below any
GPU's ridge point (peak / bandwidth, a few hundred FLOP per byte), so their ceiling is

    tokens/s <= batch x bandwidth / bytes read per step (the weights once, plus every sequence's cache).

Figures: NVIDIA's A100, H100 and H200 datasheets (dense bf16 peaks, HBM bandwidth); the laptop's
bandwidth is arithmetic (dual-channel DDR5-5600: 5600 MT/s x 16 bytes), its 32 GB of memory
is an assumed typical size, and it has no listed peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helpers.models import ModelConfig
from helpers.step_cost import step_bytes, step_flops
from helpers.units import GB, positive_int


@dataclass(frozen=True)
class Chip:
    name: str
    memory_bytes: int
    bandwidth: float  # bytes per second
    peak_flops: float | None  # dense bf16 FLOP/s; None when not published

    @property
    def ridge(self) -> float | None:
        """FLOP per byte above which a step is limited by arithmetic rather than memory."""
        return None if self.peak_flops is None else self.peak_flops / self.bandwidth


CHIPS: dict[str, Chip] = {c.name: c for c in [
    Chip("A100 40GB SXM", 40 * GB, 1555e9, 312e12),
    Chip("A100 80GB SXM", 80 * GB, 2039e9, 312e12),
    Chip("H100 SXM", 80 * GB, 3.35e12, 989e12),
    Chip("H200 SXM", 141 * GB, 4.8e12, 989e12),
    Chip("laptop, DDR5-5600 x2", 32 * GB, 5600e6 * 16, None),  # 32 GB is an assumption, not a datasheet figure
]}


def get_chip(name: str) -> Chip:
    """The chip called ``name``; ValueError lists the known ones."""
    if name not in CHIPS:
        raise ValueError(f"unknown chip {name!r}; known chips: {', '.join(CHIPS)}")
    return CHIPS[name]


def attainable_flops(chip: Chip, intensity: float) -> float:
    """The roofline: min(peak, bandwidth x intensity) FLOP/s (bandwidth x intensity without a peak)."""
    if not intensity > 0:
        raise ValueError(f"intensity must be positive, got {intensity}")
    roof = chip.bandwidth * intensity
    return roof if chip.peak_flops is None else min(chip.peak_flops, roof)


def step_seconds_bound(model: ModelConfig, chip: Chip, new: int, past: int, batch: int = 1,
                       weight_bytes_per_element: int = 2, cache_bytes_per_element: int = 2) -> float:
    """Least time for one forward step: the slower of moving its bytes and doing its FLOPs."""
    moved = step_bytes(model, new, past, batch, weight_bytes_per_element, cache_bytes_per_element) / chip.bandwidth
    computed = 0.0 if chip.peak_flops is None else step_flops(model, new, past, batch) / chip.peak_flops
    return max(moved, computed)


def decode_ceiling(model: ModelConfig, chip: Chip, batch: int, context: int, weight_bytes_per_element: int = 2,
                   cache_bytes_per_element: int = 2) -> float:
    """Most tokens per second a batch can decode at ``context`` cached tokens per sequence."""
    return batch / step_seconds_bound(model, chip, 1, context, batch, weight_bytes_per_element, cache_bytes_per_element)


def max_batch(model: ModelConfig, chip: Chip, context: int, weight_bytes_per_element: int = 2,
              cache_bytes_per_element: int = 2, block_size: int | None = None) -> int:
    """Sequences of ``context`` tokens whose caches fit beside the weights (0 if the weights do not
    fit). With ``block_size``, each sequence holds whole blocks (paging)."""
    context = positive_int("context", context)
    slots = context if block_size is None else math.ceil(context / positive_int("block_size", block_size)) * block_size
    spare = chip.memory_bytes - model.weight_bytes(weight_bytes_per_element)
    return max(0, spare // (slots * model.kv_bytes_per_token(cache_bytes_per_element)))


def memory_split(model: ModelConfig, chip: Chip, batch: int, context: int, cache_bytes_per_element: int = 2,
                 block_size: int = 16) -> dict[str, float]:
    """Bytes of the chip's memory for: weights (bf16), tokens' cache, the unused tail of each
    sequence's last block, and what is left (negative when it does not fit)."""
    per_token = model.kv_bytes_per_token(cache_bytes_per_element)
    held = math.ceil(context / block_size) * block_size
    split = {"weights": model.weight_bytes(2), "cache (tokens)": batch * context * per_token,
             "cache (block tails)": batch * (held - context) * per_token}
    split["free"] = chip.memory_bytes - sum(split.values())
    return split
