"""A paged KV-cache allocator: fixed-size blocks, a free list, a block table per sequence.

The cache memory is cut into ``num_blocks`` blocks of ``block_size`` token slots. A sequence
owns a block table, the list of its blocks in order; its token t lives in slot t % block_size
of block table[t // block_size]. Blocks are handed out as sequences grow and returned when they
finish, so memory is reserved only for tokens that exist (plus the unused tail of each last
block). ``fork`` lets a new sequence share all of a parent's blocks (parallel sampling from one
prompt): blocks carry reference counts, and a shared block is copied before it is written
(copy-on-write). ``truncate`` takes tokens back off the end (the draft tokens a verifying model rejected
in speculative decoding) and returns the blocks no longer needed.

Every operation checks first and changes state only if it can complete: running out of
blocks, freeing twice or using an unknown sequence raises ``AllocatorError`` and leaves the
allocator as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from helpers.units import positive_int


class AllocatorError(Exception):
    """A request the allocator refuses (out of blocks, unknown or freed sequence, double free)."""


@dataclass
class BlockAllocator:
    num_blocks: int
    block_size: int
    free: list[int] = field(init=False)
    refcount: list[int] = field(init=False)
    tables: dict[str, list[int]] = field(init=False, default_factory=dict)
    lengths: dict[str, int] = field(init=False, default_factory=dict)
    copies: int = field(init=False, default=0)  # blocks copied by copy-on-write

    def __post_init__(self):
        positive_int("num_blocks", self.num_blocks)
        positive_int("block_size", self.block_size)
        self.free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.refcount = [0] * self.num_blocks

    # ---- queries ---------------------------------------------------------------------------
    def blocks_needed(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
        return math.ceil(positive_int("tokens", tokens, allow_zero=True) / self.block_size)

    def _known(self, seq: str) -> list[int]:
        if seq not in self.tables:
            raise AllocatorError(f"unknown sequence {seq!r} (never allocated, or already freed)")
        return self.tables[seq]

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def stored_tokens(self) -> int:
        """Token slots in use across sequences (a shared block counts once per sequence using it)."""
        return sum(self.lengths.values())

    # ---- operations --------------------------------------------------------------------------
    def allocate(self, seq: str, tokens: int) -> list[int]:
        """Start sequence ``seq`` with ``tokens`` tokens (its prompt); returns its block table."""
        if seq in self.tables:
            raise AllocatorError(f"sequence {seq!r} already exists")
        need = self.blocks_needed(tokens)
        if need > len(self.free):
            raise AllocatorError(f"out of blocks: {seq!r} needs {need} for {tokens} tokens, {len(self.free)} free")
        self.tables[seq] = [self._take() for _ in range(need)]
        self.lengths[seq] = tokens
        return list(self.tables[seq])

    def append(self, seq: str, tokens: int = 1) -> list[int]:
        """Grow ``seq`` by ``tokens`` tokens, taking new blocks as slots run out and copying a
        shared last block before writing into it. Returns the block table."""
        table = self._known(seq)
        tokens = positive_int("tokens", tokens)
        length = self.lengths[seq]
        new_blocks = self.blocks_needed(length + tokens) - len(table)
        last_shared = bool(table) and length % self.block_size != 0 and self.refcount[table[-1]] > 1
        if new_blocks + last_shared > len(self.free):
            raise AllocatorError(f"out of blocks: {seq!r} needs {new_blocks + last_shared} more, {len(self.free)} free")
        if last_shared:  # copy-on-write: this sequence gets its own copy of the partly filled block
            self.refcount[table[-1]] -= 1
            table[-1] = self._take()
            self.copies += 1
        table.extend(self._take() for _ in range(new_blocks))
        self.lengths[seq] = length + tokens
        return list(table)

    def truncate(self, seq: str, tokens: int) -> list[int]:
        """Drop the last ``tokens`` tokens of ``seq``. Blocks it no longer needs leave its table, the
        last one first, and go back to the free list unless another sequence still holds them; so
        growing again takes back the same blocks in the same order. Returns the block table."""
        table = self._known(seq)
        tokens = positive_int("tokens", tokens, allow_zero=True)
        length = self.lengths[seq]
        if tokens > length:
            raise AllocatorError(f"cannot drop {tokens} tokens from {seq!r}, which holds {length}")
        keep = self.blocks_needed(length - tokens)
        for block in reversed(table[keep:]):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self.free.append(block)
        del table[keep:]
        self.lengths[seq] = length - tokens
        return list(table)

    def fork(self, parent: str, child: str) -> list[int]:
        """Start ``child`` as a copy of ``parent`` that shares all its blocks (no memory taken)."""
        table = self._known(parent)
        if child in self.tables:
            raise AllocatorError(f"sequence {child!r} already exists")
        for block in table:
            self.refcount[block] += 1
        self.tables[child] = list(table)
        self.lengths[child] = self.lengths[parent]
        return list(table)

    def free_sequence(self, seq: str) -> None:
        """Release ``seq``: each of its blocks returns to the free list when no one else uses it."""
        table = self._known(seq)
        for block in table:
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self.free.append(block)
        del self.tables[seq], self.lengths[seq]

    def _take(self) -> int:
        block = self.free.pop()
        self.refcount[block] = 1
        return block

    # ---- self-check -------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError unless every block is either free or in use, never both, and
        each block's reference count equals the number of tables that hold it."""
        held = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                held[block] += 1
        assert len(set(self.free)) == len(self.free), "a block is on the free list twice"
        for block in range(self.num_blocks):
            on_free = block in self.free
            assert on_free != (held[block] > 0), f"block {block} is {'both free and used' if on_free else 'neither free nor used'}"
            assert self.refcount[block] == held[block], f"block {block}: refcount {self.refcount[block]}, held by {held[block]}"
        for seq, table in self.tables.items():
            assert len(table) == self.blocks_needed(self.lengths[seq]), f"{seq!r} has {len(table)} blocks for {self.lengths[seq]} tokens"
