"""helpers.paged_attention: attention through a block table equals attention over a contiguous cache."""

import pytest
import torch
import torch.nn.functional as F

from helpers.llama import causal_mask
from helpers.paged_attention import gather_blocks, paged_attention, write_blocks
from helpers.paged_kv import BlockAllocator


def contiguous(q, k, v):
    mask = causal_mask(q.shape[1], k.shape[1])
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                          enable_gqa=q.shape[0] != k.shape[0])[0]


@pytest.mark.parametrize("length, block_size, n_new", [(1, 4, 1), (37, 8, 1), (64, 16, 5), (100, 128, 3)])
def test_paged_attention_equals_contiguous_attention(length, block_size, n_new):
    g = torch.Generator().manual_seed(length)
    k, v = torch.randn(2, 3, length, 16, generator=g)
    q = torch.randn(9, n_new, 16, generator=g)
    pool = BlockAllocator(num_blocks=64, block_size=block_size)
    pool.allocate("other", 2 * block_size)  # someone else's blocks first, so this table is not 0, 1, 2, ...
    table = pool.allocate("seq", length)
    key_pool, value_pool = torch.zeros(2, 64, 3, block_size, 16)
    write_blocks(key_pool, table, k)
    write_blocks(value_pool, table, v)
    assert torch.equal(gather_blocks(key_pool, table, length), k)
    torch.testing.assert_close(paged_attention(q, key_pool, value_pool, table, length), contiguous(q, k, v))


def test_shuffled_block_tables_read_the_right_rows():
    k = torch.arange(12, dtype=torch.float32).view(1, 12, 1)
    pool = torch.zeros(5, 1, 4, 1)
    write_blocks(pool, [3, 0, 4], k)
    assert pool[3, 0, :, 0].tolist() == [0, 1, 2, 3] and pool[4, 0, :, 0].tolist() == [8, 9, 10, 11]
    assert gather_blocks(pool, [3, 0, 4], 10)[0, :, 0].tolist() == list(range(10))


def test_bad_tables_and_shapes_are_refused():
    pool = torch.zeros(4, 2, 8, 16)
    with pytest.raises(ValueError, match="must cover the 20 tokens"):
        gather_blocks(pool, [0, 1], 20)
    with pytest.raises(ValueError, match=r"block numbers must be in 0\.\.3"):
        gather_blocks(pool, [0, 7], 10)
    with pytest.raises(ValueError, match="kv_heads=2"):
        write_blocks(pool, [0], torch.zeros(3, 4, 16))
    with pytest.raises(ValueError, match="cannot share"):
        paged_attention(torch.zeros(3, 1, 16), pool, pool, [0], 4)
    with pytest.raises(ValueError, match="n_new <= length"):
        paged_attention(torch.zeros(2, 5, 16), pool, pool, [0], 4)
