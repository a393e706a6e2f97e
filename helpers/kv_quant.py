"""8-bit storage of keys and values: int8 and float8 (e4m3, e5m2), with a scale per tensor,
per channel or per token, and the errors each choice causes.

Arrays are (tokens, channels) (one head), or have more leading axes. A scale maps the stored
range onto the format's range: ``x ~ q * scale``. Granularity says which elements share a
scale: "tensor" (one for all), "channel" (one per channel, over the tokens) or "token" (one
per token, over the channels). The float8 values are produced by torch's own float8 dtypes,
which exist on the CPU; what is stored is one byte per element.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from helpers.attention import grouped_query_attention
from helpers.llama import KVCache, apply_rope

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FORMATS = ("int8", "e4m3", "e5m2")  # the 8-bit formats; "bf16" (no scale) is accepted as the 16-bit baseline
GRANULARITIES = ("tensor", "channel", "token")


def format_max(fmt: str) -> float:
    """Largest magnitude a format stores: 127 for int8 (symmetric), torch.finfo(...).max for float8."""
    if fmt == "int8":
        return 127.0
    if fmt in FP8:
        return float(torch.finfo(FP8[fmt]).max)
    raise ValueError(f"fmt must be one of {', '.join(FORMATS)}; got {fmt!r}")


def compute_scale(x: np.ndarray, fmt: str, granularity: str = "tensor") -> np.ndarray:
    """Scale(s) mapping each group's largest |x| onto the format's largest value.

    Shape: broadcastable to x ((1, channels) per channel, (tokens, 1) per token). A group of zeros gets 1.
    """
    x = _as_matrix(x)
    axis = {"tensor": (-2, -1), "channel": -2, "token": -1}.get(granularity)
    if axis is None:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}; got {granularity!r}")
    amax = np.max(np.abs(x), axis=axis, keepdims=True)
    return np.where(amax > 0, amax / format_max(fmt), 1.0)


def quantize(x: np.ndarray, fmt: str, granularity: str = "tensor", scale=None) -> tuple[np.ndarray, np.ndarray]:
    """Store x in 8 bits: (codes, scale). Codes are int8 for "int8" and the raw float8 bytes (uint8)
    otherwise. ``scale`` (a number, or an array that broadcasts to x) overrides the computed one,
    e.g. 1.0, an uncalibrated scale; values beyond the format's range saturate at its largest value."""
    x = _as_matrix(x)
    if scale is None:
        scale = compute_scale(x, fmt, granularity)
    else:
        scale = np.asarray(scale, dtype=float)
        try:
            np.broadcast_shapes(scale.shape, x.shape)
        except ValueError:
            raise ValueError(f"scale of shape {scale.shape} does not broadcast to x of shape {x.shape}") from None
        if not np.all(np.isfinite(scale) & (scale > 0)):
            raise ValueError("scale must be positive and finite")
    limit = format_max(fmt)
    scaled = np.clip(x / scale, -limit, limit)
    if fmt == "int8":
        return np.rint(scaled).astype(np.int8), scale
    codes = torch.from_numpy(scaled.astype(np.float32)).to(FP8[fmt]).view(torch.uint8).numpy()
    return codes, scale


def dequantize(codes: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """Back to float32: codes x scale."""
    if fmt == "int8":
        values = codes.astype(np.float32)
    elif fmt in FP8:
        values = torch.from_numpy(np.ascontiguousarray(codes)).view(FP8[fmt]).to(torch.float32).numpy()
    else:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return values * np.asarray(scale, dtype=np.float32)


def roundtrip(x: np.ndarray, fmt: str, granularity: str = "tensor", scale=None) -> np.ndarray:
    """x stored in ``fmt`` and read back ("bf16": rounded to bfloat16, no scale)."""
    if fmt == "bf16":
        return torch.from_numpy(_as_matrix(x).astype(np.float32)).to(torch.bfloat16).to(torch.float32).numpy()
    codes, used = quantize(x, fmt, granularity, scale)
    return dequantize(codes, used, fmt)


def _as_matrix(x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim < 2 or x.size == 0:
        raise ValueError(f"x must be a non-empty array of shape (..., tokens, channels), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"x must hold floating-point numbers, got dtype {x.dtype}")
    return x


# ---- a test bed: keys with outlier channels, values with loud tokens -------------------
@dataclass(frozen=True)
class KVSample:
    """One attention head's queries (n_q, d), keys and values (n_kv, d), in float32."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray


def synthetic_qkv(n_q: int = 64, n_kv: int = 1024, head_dim: int = 128, outlier_channels: int = 4,
                  outlier_size: float = 15.0, value_std: float = 0.02, loud_tokens: int = 8,
                  score_std: float = 2.5, seed: int = 0) -> KVSample:
    """Queries, keys and values with the structure that matters for 8-bit storage.

    Keys: unit-scale channels with a per-channel offset, plus ``outlier_channels`` channels whose
    values sit near +-``outlier_size`` for every token (keys in trained models show such fixed
    large channels). Values: small (std ``value_std``) with ``loud_tokens`` tokens 20x louder.
    Queries are scaled so each query's scores spread with standard deviation ``score_std`` over
    the keys (a constant shift per query would not change the softmax).
    """
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(n_kv, head_dim)) + rng.normal(0, 1, size=(1, head_dim))
    channels = rng.choice(head_dim, size=outlier_channels, replace=False)
    signs = rng.choice([-1.0, 1.0], size=outlier_channels)
    k[:, channels] = signs * outlier_size + rng.normal(0, outlier_size / 5, size=(n_kv, outlier_channels))
    v = rng.normal(0, value_std, size=(n_kv, head_dim))
    v[rng.choice(n_kv, size=loud_tokens, replace=False)] *= 20
    q = rng.normal(size=(n_q, head_dim))
    scores = q @ k.T / np.sqrt(head_dim)
    q *= score_std / np.std(scores - scores.mean(axis=1, keepdims=True))  # spread within each row
    return KVSample(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Single-head attention of (n_q, d) queries over (n_kv, d) keys/values: (output, weights)."""
    out, weights = grouped_query_attention(q[None].astype(np.float64), k[None].astype(np.float64),
                                           v[None].astype(np.float64), return_weights=True)
    return out[0], weights[0]


def storage_errors(sample: KVSample, which: str, fmt: str, granularity: str, scale=None) -> dict[str, float]:
    """Store only the keys or only the values of ``sample`` in 8 bits and measure what changes.

    Returns the relative reconstruction error ||x' - x|| / ||x||, the mean total-variation
    distance between exact and new attention weights (0: same, 1: disjoint), and the relative
    error of the attention output.
    """
    if which not in ("keys", "values"):
        raise ValueError(f"which must be 'keys' or 'values'; got {which!r}")
    exact = sample.k if which == "keys" else sample.v
    stored = roundtrip(exact, fmt, granularity, scale)
    k, v = (stored, sample.v) if which == "keys" else (sample.k, stored)
    out, weights = attention(sample.q, sample.k, sample.v)
    out_8, weights_8 = attention(sample.q, k, v)
    return {
        "reconstruction": float(np.linalg.norm(stored - exact) / np.linalg.norm(exact)),
        "weights_tv": float(0.5 * np.abs(weights_8 - weights).sum(axis=-1).mean()),
        "output": float(np.linalg.norm(out_8 - out) / np.linalg.norm(out)),
    }


def magnitude_sweep(fmt: str, stds, scale=None, seed: int = 0) -> np.ndarray:
    """Relative reconstruction error of Gaussian data of each standard deviation in ``stds``,
    stored per tensor with a computed scale, or with the fixed ``scale`` (e.g. 1.0)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(256, 64))
    errors = []
    for std in stds:
        x = (base * std).astype(np.float32)
        errors.append(np.linalg.norm(roundtrip(x, fmt, "tensor", scale) - x) / np.linalg.norm(x))
    return np.array(errors)


@lru_cache(maxsize=4)
def error_table(seed: int = 0) -> tuple[dict, ...]:
    """storage_errors for keys and values: bf16, then every 8-bit format x granularity plus an
    uncalibrated scale of 1.0, on ``synthetic_qkv(seed=seed)``. Rows: which, fmt, scaling, errors."""
    sample = synthetic_qkv(seed=seed)
    rows = []
    for which in ("keys", "values"):
        rows.append({"which": which, "fmt": "bf16", "scaling": "none", **storage_errors(sample, which, "bf16", "tensor")})
        for fmt in FORMATS:
            for scaling in GRANULARITIES + ("uncalibrated",):
                granularity, scale = ("tensor", 1.0) if scaling == "uncalibrated" else (scaling, None)
                rows.append({"which": which, "fmt": fmt, "scaling": scaling,
                             **storage_errors(sample, which, fmt, granularity, scale)})
    return tuple(rows)


def error_table_text(seed: int = 0) -> str:
    """error_table as an aligned text table, errors in percent."""
    lines = [f"{'stored':7} {'format':6} {'scale':13} {'tensor error':>13} {'weight moved':>13} {'output error':>13}"]
    for r in error_table(seed):
        lines.append(f"{r['which']:7} {r['fmt']:6} {r['scaling']:13} {100 * r['reconstruction']:>12.2f}% "
                     f"{100 * r['weights_tv']:>12.2f}% {100 * r['output']:>12.2f}%")
    return "\n".join(lines)


# ---- a real model's keys and values -----------------------------------------------------
# Tensors here are torch: queries (layers, heads, tokens, head_dim), keys and values
# (layers, kv_heads, tokens, head_dim), after RoPE, as the cache stores them. A scale "per tensor"
# is one per (layer, K/V head) matrix of (tokens, head_dim).

def stored(x: torch.Tensor, fmt: str | None, granularity: str) -> torch.Tensor:
    """x (..., tokens, head_dim) as stored in ``fmt`` and read back (None: unchanged)."""
    if fmt is None:
        return x
    return torch.from_numpy(roundtrip(x.detach().cpu().float().numpy(), fmt, granularity)).to(x.dtype)


@torch.no_grad()
def collect_qkv(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(queries, keys, values) of every layer of ``model`` (a ``helpers.llama`` decoder) reading
    ``ids`` (1, tokens), after RoPE, in float32. Keys and values are read from a KVCache."""

    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, tokens), got shape {tuple(ids.shape)}")
    c = model.config
    queries = []

    def keep_query(attention, args):
        x, cos, sin = args[:3]  # the layer's normalised input and the rotary angles
        q = attention.q_proj(x).view(1, x.shape[1], c.q_heads, c.head_dim).transpose(1, 2)
        queries.append(apply_rope(q, cos, sin)[0].float())

    hooks = [layer.self_attn.register_forward_pre_hook(keep_query) for layer in model.model.layers]
    try:
        cache = KVCache(c, 1, ids.shape[1], next(model.parameters()).dtype, ids.device)
        model(ids, cache)
    finally:
        for hook in hooks:
            hook.remove()
    held = slice(0, cache.length)
    return (torch.stack(queries), cache.keys[:, 0, :, held].float().clone(), cache.values[:, 0, :, held].float().clone())


def layer_output_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, which: str, fmt: str,
                        granularity: str) -> np.ndarray:
    """Per layer, the relative error ||o' - o|| / ||o|| of the causal attention output (all heads and
    tokens) when only the keys or only the values are stored in ``fmt`` with ``granularity``."""
    if which not in ("keys", "values"):
        raise ValueError(f"which must be 'keys' or 'values'; got {which!r}")
    group = q.shape[1] // k.shape[1]
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=group > 1)
    k8, v8 = (stored(k, fmt, granularity), v) if which == "keys" else (k, stored(v, fmt, granularity))
    out = torch.nn.functional.scaled_dot_product_attention(q, k8, v8, is_causal=True, enable_gqa=group > 1)
    return ((out - exact).flatten(1).norm(dim=1) / exact.flatten(1).norm(dim=1)).numpy()


class StoredKVCache(KVCache):
    """A ``helpers.llama.KVCache`` that stores each appended chunk of keys and values in ``fmt``
    (None: as given), keys and values each with their own granularity; scales cover the chunk.
    Other keyword arguments (capacity, dtype, ...) are KVCache's."""

    def __init__(self, config, fmt: str | None, key_granularity: str = "channel", value_granularity: str = "token",
                 **cache_kwargs):
        for name, granularity in (("key_granularity", key_granularity), ("value_granularity", value_granularity)):
            if granularity not in GRANULARITIES:
                raise ValueError(f"{name} must be one of {', '.join(GRANULARITIES)}; got {granularity!r}")
        if fmt is not None and fmt not in FORMATS + ("bf16",):
            raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, 'bf16' or None; got {fmt!r}")
        super().__init__(config, **cache_kwargs)
        self.fmt, self.key_granularity, self.value_granularity = fmt, key_granularity, value_granularity

    def append(self, layer, k, v):
        return super().append(layer, stored(k, self.fmt, self.key_granularity),
                              stored(v, self.fmt, self.value_granularity))


@torch.no_grad()
def stored_cache_loss(model, ids: torch.Tensor, fmt: str | None, key_granularity: str = "channel",
                      value_granularity: str = "token") -> float:
    """Mean next-token loss (nats per token) of ``ids`` (1, tokens) read in one prefill whose cache
    stores keys and values in ``fmt`` (None: full precision): every attention reads stored values."""
    cache = StoredKVCache(model.config, fmt, key_granularity, value_granularity, batch=1, capacity=ids.shape[1],
                            dtype=next(model.parameters()).dtype, device=ids.device)
    logits = model(ids, cache)[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]))


REAL_RESULTS = Path(__file__).resolve().parents[1] / "results" / "kv_quant_real.json"


def load_real_results(path: Path = REAL_RESULTS) -> dict:
    """The measurements of scripts/kv_quant_real.py on SmolLM2 (lesson 02 loads them)."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} is missing: run python scripts/kv_quant_real.py")
    return json.loads(Path(path).read_text())


def measured_errors(storage: str, scaling: str) -> dict[str, dict[str, float]]:
    """The lesson's measured errors ('keys'/'values' -> error dict) for this storage and scaling."""
    wanted = ("bf16", "none") if storage == "bf16" else (storage, scaling)
    rows = {r["which"]: r for r in error_table() if (r["fmt"], r["scaling"]) == wanted}
    if len(rows) != 2:
        raise ValueError(f"no measurement for storage {storage!r} with scaling {scaling!r}")
    return rows
