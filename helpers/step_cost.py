"""What one forward pass of a decoder costs: floating-point operations and bytes of memory read.

For a model shape (``helpers.models.ModelConfig``), a step that processes ``new`` tokens per
sequence after ``past`` cached ones, for ``batch`` sequences:

- FLOPs: 2 per multiply-add. The matrix products touch every weight once per token
  (2 x weights x new x batch); attention adds 4 x layers x q_heads x head_dim per (query, key)
  pair it computes (q k and the weighted sum of v), with causal masking inside the new tokens.
- Bytes: the weights are read once per step, whatever the batch; each sequence's cache of past
  tokens is read, and its new keys and values are written. For a mixture of experts only the
  active experts' weights are counted, which holds for a batch of one; a large batch touches
  more of the experts. Activations are left out (small next
  to both for the shapes of interest).

Prefill is one step with new = prompt length; decode is a step with new = 1. Sliding windows and
MLA's absorbed form are not modelled: attention is counted over every past token.
"""

from __future__ import annotations

from helpers.models import ModelConfig
from helpers.units import positive_int


def matmul_weights(model: ModelConfig) -> int:
    """Weights used in matrix products per token: active parameters minus embedding lookups."""
    lookups = 0 if model.tied_embeddings else model.vocab * model.hidden
    if model.learned_positions:
        lookups += model.max_context * model.hidden
    return model.active_param_count() - lookups


def step_flops(model: ModelConfig, new: int, past: int = 0, batch: int = 1) -> int:
    """Floating-point operations of one forward pass over ``new`` tokens after ``past`` cached ones."""
    new, past, batch = positive_int("new", new), positive_int("past", past, allow_zero=True), positive_int("batch", batch)
    pairs = new * past + new * (new + 1) // 2  # (query, key) pairs, causal within the new tokens
    attention = 4 * model.layers * model.q_heads * model.head_dim * pairs
    return batch * (2 * matmul_weights(model) * new + attention)


def step_bytes(model: ModelConfig, new: int, past: int = 0, batch: int = 1, weight_bytes_per_element: int = 2,
               cache_bytes_per_element: int = 2) -> int:
    """Bytes one forward pass reads and writes: the weights once, plus every sequence's cache."""
    new, past, batch = positive_int("new", new), positive_int("past", past, allow_zero=True), positive_int("batch", batch)
    weights = model.active_param_count() * positive_int("weight_bytes_per_element", weight_bytes_per_element)
    per_token = model.kv_bytes_per_token(cache_bytes_per_element)
    return weights + batch * (past + new) * per_token


def arithmetic_intensity(model: ModelConfig, new: int, past: int = 0, batch: int = 1, **bytes_kwargs) -> float:
    """FLOPs per byte moved for that step: low (about 1 for a batch of one) in decode, high in prefill."""
    return step_flops(model, new, past, batch) / step_bytes(model, new, past, batch, **bytes_kwargs)
