"""Attention that reads keys and values through a block table, as PagedAttention does.

The cache of every sequence lives in one pool of fixed-size blocks (``helpers.paged_kv`` hands
them out): ``key_pool`` and ``value_pool`` are (num_blocks, kv_heads, block_size, head_dim),
and a sequence's token t sits in slot t % block_size of block ``block_table[t // block_size]``.
``write_blocks`` stores a sequence's keys or values in its blocks; ``paged_attention`` gathers
them back in order and attends, which gives the same output as attention over one contiguous
cache. The gather is the price of paging: a copy of the sequence's blocks before attention
(real kernels fuse it into the attention loop instead of copying).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.llama import causal_mask


def _table(block_table, length: int, block_size: int, num_blocks: int) -> torch.Tensor:
    table = torch.as_tensor(block_table, dtype=torch.long)
    if table.ndim != 1 or length < 1 or table.numel() * block_size < length:
        raise ValueError(f"the block table ({table.numel()} blocks of {block_size}) must cover the {length} tokens")
    if table.numel() and (table.min() < 0 or table.max() >= num_blocks):
        raise ValueError(f"block numbers must be in 0..{num_blocks - 1}; got {table.tolist()}")
    return table


def write_blocks(pool: torch.Tensor, block_table, x: torch.Tensor) -> None:
    """Store x (kv_heads, length, head_dim) in ``pool`` (num_blocks, kv_heads, block_size, head_dim)
    at the slots the block table gives, token t in slot t % block_size of block table[t // block_size]."""
    num_blocks, kv_heads, block_size, head_dim = pool.shape
    if x.ndim != 3 or x.shape[0] != kv_heads or x.shape[2] != head_dim:
        raise ValueError(f"x must be (kv_heads={kv_heads}, length, head_dim={head_dim}); got {tuple(x.shape)}")
    length = x.shape[1]
    table = _table(block_table, length, block_size, num_blocks)
    for i, block in enumerate(table.tolist()):
        rows = x[:, i * block_size:(i + 1) * block_size]
        pool[block, :, :rows.shape[1]] = rows


def gather_blocks(pool: torch.Tensor, block_table, length: int) -> torch.Tensor:
    """A sequence's first ``length`` rows, (kv_heads, length, head_dim), read from its blocks in order."""
    num_blocks, kv_heads, block_size, head_dim = pool.shape
    table = _table(block_table, length, block_size, num_blocks)
    blocks = pool[table]  # (blocks, kv_heads, block_size, head_dim): the gather
    return blocks.transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :length]


def paged_attention(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor, block_table,
                    length: int) -> torch.Tensor:
    """Attention of one sequence's newest queries q (heads, n_new, head_dim) over its ``length``
    cached positions, read through its block table; causal, aligned to the end. (heads, n_new, head_dim)."""
    if q.ndim != 3 or q.shape[1] > length:
        raise ValueError(f"q must be (heads, n_new <= length, head_dim); got {tuple(q.shape)} for length {length}")
    k, v = gather_blocks(key_pool, block_table, length), gather_blocks(value_pool, block_table, length)
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads cannot share {k.shape[0]} K/V heads evenly")
    mask = causal_mask(q.shape[1], length, q.device)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                          enable_gqa=q.shape[0] != k.shape[0])[0]
