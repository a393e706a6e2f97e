"""Prefix caching: chained block hashes, lookup, sharing, and least-recently-used eviction."""

import pytest

from helpers.paged_kv import AllocatorError
from helpers.prefix_cache import PrefixCachingAllocator, block_hash, prefix_hashes


def test_hashes_chain_over_the_blocks_before():
    a, b = list(range(8)), list(range(100, 108))
    assert prefix_hashes(a + b, 4) == [block_hash(None, a[:4]), block_hash(block_hash(None, a[:4]), a[4:]),
                                       prefix_hashes(a + b, 4)[2], prefix_hashes(a + b, 4)[3]]
    # the same block after a different first block gets a different key
    assert prefix_hashes(b[:4] + a[4:], 4)[1] != prefix_hashes(a, 4)[1]
    assert len(prefix_hashes(list(range(11)), 4)) == 2  # the partly filled block has none
    assert block_hash(None, [1, 23]) != block_hash(None, [12, 3])


def _served(allocator, seq, tokens):
    allocator.allocate(seq, len(tokens))
    allocator.register(seq, tokens)


def test_lookup_finds_the_longest_cached_prefix_and_adopt_shares_it():
    cache = PrefixCachingAllocator(num_blocks=8, block_size=4)
    tokens = list(range(10))
    _served(cache, "a", tokens)
    assert cache.lookup(tokens) == cache.tables["a"][:2]
    assert cache.lookup(tokens[:4] + [99] * 6) == cache.tables["a"][:1]  # stops at the first miss
    assert cache.lookup([99] + tokens) == []
    assert cache.lookup(tokens, limit=1) == cache.tables["a"][:1]
    cache.adopt("b", cache.lookup(tokens))
    assert cache.refcount[cache.tables["a"][0]] == 2
    cache.append("b", 3)  # b's own new block after the shared ones
    assert cache.tables["b"][:2] == cache.tables["a"][:2] and cache.tables["b"][2] != cache.tables["a"][2]
    cache.check()


def test_freed_blocks_stay_cached_until_taken_least_recently_freed_first():
    cache = PrefixCachingAllocator(num_blocks=4, block_size=2)
    _served(cache, "a", [1, 2, 3, 4])
    _served(cache, "b", [5, 6, 7, 8])
    first_a = list(cache.tables["a"])
    cache.free_sequence("a")
    cache.free_sequence("b")
    assert cache.used_blocks == 0 and cache.evictable() == 4
    assert cache.lookup([1, 2, 3, 4, 0]) == first_a  # still there after its sequence ended
    cache.allocate("c", 2)  # no empty block left: evicts a's last block (released first)
    assert cache.evictions == 1
    assert cache.lookup([1, 2, 3, 4, 0]) == first_a[:1]
    cache.adopt("d", first_a[:1])  # a hit on a free block takes it off the free list
    assert cache.refcount[first_a[0]] == 1 and first_a[0] not in cache.free
    cache.check()


def test_adopt_refuses_blocks_that_are_not_cached_and_existing_sequences():
    cache = PrefixCachingAllocator(num_blocks=4, block_size=2)
    _served(cache, "a", [1, 2, 3])
    with pytest.raises(AllocatorError, match="not all cached"):
        cache.adopt("b", cache.tables["a"])  # the second block is partly filled, never hashed
    with pytest.raises(AllocatorError, match="already exists"):
        cache.adopt("a", [])


def test_a_duplicate_prefix_computed_twice_is_registered_once():
    cache = PrefixCachingAllocator(num_blocks=4, block_size=2)
    _served(cache, "a", [1, 2])
    _served(cache, "b", [1, 2])  # computed side by side before either was cached
    assert len(cache.cached) == 1
    cache.free_sequence("b")
    assert cache.evictable() == 0  # b's copy went back as an empty block
    cache.check()


def test_register_hashes_only_new_blocks_and_forgets_truncated_ones():
    cache = PrefixCachingAllocator(num_blocks=8, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    cache.allocate("a", 3)
    cache.register("a", tokens[:3])
    cache.append("a", 2)
    cache.register("a", tokens)
    assert cache.keys_of["a"] == prefix_hashes(tokens, 2)
    cache.truncate("a", 3)  # 2 tokens left: one full block
    assert cache.keys_of["a"] == prefix_hashes(tokens, 2)[:1]
    cache.free_sequence("a")
    assert "a" not in cache.keys_of
    cache.check()
