"""Prefix caching: full blocks of keys and values found again by a hash of their tokens.

Requests often start the same way (a system prompt, a few-shot preamble, a conversation's earlier
turns, a preempted request computed again). Their keys and values are the same too, because a
token's K and V depend only on the tokens up to it. So a full block can be kept after its sequence
ends and handed to the next sequence whose tokens match, which then skips computing it.

A block's key is a hash of its tokens *and of the blocks before it*: ``block_hash(parent, tokens)``
chains them, so equal hashes mean equal whole prefixes, not just one equal block (vLLM's automatic
prefix caching does the same; SGLang keeps the prefixes in a radix tree instead). Only full blocks
are hashed: a partly filled block is still being written.

``PrefixCachingAllocator`` is lesson 05's ``BlockAllocator`` plus a table from hash to block.
A block whose last user has finished keeps its contents and its hash and stays on the free list,
so it can be taken back on a hit (its reference count goes from 0 to 1) or handed out as an empty
block when nothing else is free; then its hash is forgotten. Empty blocks go first, then cached
ones, least recently freed first (LRU). A sequence's blocks are released last block first, so a
prefix's later blocks are evicted before its first ones, which every hit needs.
"""

from __future__ import annotations

import hashlib

from helpers.paged_kv import AllocatorError, BlockAllocator
from helpers.units import positive_int


def block_hash(parent: str | None, tokens) -> str:
    """The key of a full block: SHA-256 (hex) over the previous block's key and this block's token ids."""
    text = f"{parent or ''}|{','.join(str(int(t)) for t in tokens)}"
    return hashlib.sha256(text.encode()).hexdigest()


def prefix_hashes(tokens, block_size: int) -> list[str]:
    """The chained keys of every full block of ``tokens``, in order (a partly filled last block has none)."""
    block_size = positive_int("block_size", block_size)
    keys, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


class PrefixCachingAllocator(BlockAllocator):
    """A ``BlockAllocator`` whose full blocks stay findable by their prefix hash (see the module text).

    Counters: ``lookups`` (blocks looked up), ``hits`` (found), ``evictions`` (cached blocks reused empty).
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.cached: dict[str, int] = {}  # prefix hash -> block holding those tokens
        self.hash_of: dict[int, str] = {}  # the other way round
        self.keys_of: dict[str, list[str]] = {}  # per sequence, the keys of its full blocks registered so far
        self.lookups = self.hits = self.evictions = 0

    def lookup(self, tokens, limit: int | None = None) -> list[int]:
        """Blocks that already hold ``tokens``' longest cached prefix of full blocks, in order (at most
        ``limit`` blocks). Stops at the first block not in the cache: a later one cannot match without it."""
        found = []
        for key in prefix_hashes(tokens, self.block_size)[:limit]:
            self.lookups += 1
            if key not in self.cached:
                break
            found.append(self.cached[key])
            self.hits += 1
        return found

    def adopt(self, seq: str, blocks: list[int]) -> list[int]:
        """Start ``seq`` on cached ``blocks`` (from ``lookup``): it shares them, taking back the ones
        no one was using from the free list. Returns its block table."""
        if seq in self.tables:
            raise AllocatorError(f"sequence {seq!r} already exists")
        if any(block not in self.hash_of for block in blocks):
            raise AllocatorError(f"blocks {blocks} are not all cached")
        for block in blocks:
            if self.refcount[block] == 0:
                self.free.remove(block)
            self.refcount[block] += 1
        self.tables[seq] = list(blocks)
        self.lengths[seq] = len(blocks) * self.block_size
        self.keys_of[seq] = [self.hash_of[block] for block in blocks]
        return list(blocks)

    def register(self, seq: str, tokens) -> None:
        """Record the prefix hashes of ``seq``'s full blocks, whose K and V hold ``tokens`` (the
        sequence's tokens computed so far); only blocks filled since the last call are hashed. A
        block whose prefix another block already holds stays unregistered, and is freed as an empty
        block."""
        table = self._known(seq)
        keys = self.keys_of.setdefault(seq, [])  # the chained keys of its full blocks so far
        for index in range(len(keys), len(tokens) // self.block_size):
            start = index * self.block_size
            key = block_hash(keys[-1] if keys else None, tokens[start:start + self.block_size])
            keys.append(key)
            if key not in self.cached and table[index] not in self.hash_of:
                self.cached[key], self.hash_of[table[index]] = table[index], key

    def free_sequence(self, seq: str) -> None:
        """Release ``seq``'s blocks, its last block first (evicted first: see the module text)."""
        self._known(seq).reverse()
        super().free_sequence(seq)
        self.keys_of.pop(seq, None)

    def truncate(self, seq: str, tokens: int) -> list[int]:
        """Lesson 05's truncate; the keys of blocks no longer full are forgotten for ``seq``."""
        table = super().truncate(seq, tokens)
        del self.keys_of.get(seq, [])[self.lengths[seq] // self.block_size:]
        return table

    def evictable(self) -> int:
        """Free blocks that still hold a cached prefix."""
        return sum(block in self.hash_of for block in self.free)

    def _take(self) -> int:
        # an empty block if there is one (from the end of the free list, as before); else evict the
        # cached block freed longest ago: blocks are appended to the free list as they are freed
        for i in range(len(self.free) - 1, -1, -1):
            if self.free[i] not in self.hash_of:
                block = self.free.pop(i)
                break
        else:
            block = self.free.pop(0)
            del self.cached[self.hash_of.pop(block)]
            self.evictions += 1
        self.refcount[block] = 1
        return block

    def check(self) -> None:
        """The allocator's own check, plus: the hash table and its inverse agree."""
        super().check()
        assert all(self.hash_of.get(block) == key for key, block in self.cached.items()), "hash table out of step"
        assert len(self.cached) == len(self.hash_of), "hash table out of step"
