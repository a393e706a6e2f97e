"""helpers.paged_kv: the block allocator's bookkeeping, copy-on-write, refusals and self-check."""

import random

import pytest

from helpers.paged_kv import AllocatorError, BlockAllocator


def snapshot(allocator):
    """Everything an operation may change, copied."""
    return (list(allocator.free), list(allocator.refcount), {k: list(v) for k, v in allocator.tables.items()},
            dict(allocator.lengths), allocator.copies)


def refused(allocator, operation, *args, match):
    """Call ``operation``; it must raise AllocatorError matching ``match`` and change nothing."""
    before = snapshot(allocator)
    with pytest.raises(AllocatorError, match=match):
        getattr(allocator, operation)(*args)
    assert snapshot(allocator) == before
    allocator.check()


# ---- basics ---------------------------------------------------------------------------------

def test_blocks_are_handed_out_in_order():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    assert allocator.allocate("a", 5) == [0, 1]
    assert allocator.allocate("b", 4) == [2]
    assert allocator.append("a", 4) == [0, 1, 3]  # 9 tokens: a third block
    assert allocator.used_blocks == 4 and allocator.stored_tokens() == 13
    allocator.check()


@pytest.mark.parametrize("tokens, blocks", [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3), (400, 100)])
def test_blocks_needed_rounds_up(tokens, blocks):
    assert BlockAllocator(num_blocks=1, block_size=4).blocks_needed(tokens) == blocks


def test_table_grows_exactly_when_length_crosses_a_multiple_of_the_block_size():
    allocator = BlockAllocator(num_blocks=10, block_size=4)
    allocator.allocate("s", 0)
    assert allocator.tables["s"] == []
    sizes = []
    for _ in range(13):
        sizes.append(len(allocator.append("s", 1)))
    # lengths 1..13: a new block at lengths 1, 5, 9, 13
    assert sizes == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4]
    assert allocator.lengths["s"] == 13
    allocator.check()


def test_free_sequence_returns_its_blocks():
    allocator = BlockAllocator(num_blocks=6, block_size=4)
    allocator.allocate("a", 10)
    allocator.allocate("b", 3)
    allocator.free_sequence("a")
    assert allocator.used_blocks == 1 and sorted(allocator.free) == [0, 1, 2, 4, 5]
    assert "a" not in allocator.tables and "a" not in allocator.lengths
    assert allocator.refcount[:3] == [0, 0, 0]
    allocator.check()
    assert sorted(allocator.allocate("c", 20)) == [0, 1, 2, 4, 5]  # all five come back into use


def test_truncate_releases_the_blocks_it_no_longer_needs_last_first():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("s", 10)  # blocks 0, 1, 2
    assert allocator.truncate("s", 1) == [0, 1, 2] and allocator.lengths["s"] == 9  # still in block 2
    assert allocator.truncate("s", 5) == [0] and allocator.free[-2:] == [2, 1]  # 4 tokens fill block 0
    assert allocator.append("s", 5) == [0, 1, 2]  # growing again takes back the same blocks in order
    assert allocator.truncate("s", 9) == [] and allocator.used_blocks == 0
    allocator.check()


def test_truncate_keeps_blocks_another_sequence_shares():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("p", 8)
    allocator.fork("p", "c")
    assert allocator.truncate("c", 8) == [] and allocator.used_blocks == 2  # p still holds both
    assert allocator.tables["p"] == [0, 1] and allocator.refcount[:2] == [1, 1]
    allocator.check()


def test_truncate_refuses_more_tokens_than_the_sequence_holds():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("s", 3)
    with pytest.raises(AllocatorError, match="cannot drop 4 tokens from 's', which holds 3"):
        allocator.truncate("s", 4)
    with pytest.raises(ValueError):
        allocator.truncate("s", -1)
    assert allocator.tables["s"] == [0] and allocator.lengths["s"] == 3


def test_fork_shares_blocks_without_using_memory():
    allocator = BlockAllocator(num_blocks=6, block_size=4)
    parent = allocator.allocate("p", 6)
    free_before = list(allocator.free)
    assert allocator.fork("p", "c") == parent
    assert allocator.free == free_before and allocator.used_blocks == 2
    assert allocator.lengths["c"] == 6 and allocator.refcount[:2] == [2, 2]
    assert allocator.tables["c"] is not allocator.tables["p"]  # its own table, the same blocks
    allocator.check()
    allocator.free_sequence("p")  # the child still holds the blocks
    assert allocator.used_blocks == 2 and allocator.refcount[:2] == [1, 1]
    allocator.check()


def test_copy_on_write_of_a_shared_partly_filled_last_block():
    allocator = BlockAllocator(num_blocks=6, block_size=4)
    allocator.allocate("p", 6)  # blocks 0 (full), 1 (2 of 4 slots)
    allocator.fork("p", "c")
    assert allocator.append("c", 1) == [0, 2]  # block 1 copied into block 2 before the write
    assert allocator.copies == 1
    assert allocator.tables["p"] == [0, 1] and allocator.refcount[:3] == [2, 1, 1]
    allocator.check()
    assert allocator.append("p", 1) == [0, 1]  # block 1 is now p's alone: written in place
    assert allocator.copies == 1
    allocator.check()


def test_copy_on_write_together_with_new_blocks():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("p", 6)
    allocator.fork("p", "c")
    assert allocator.append("c", 7) == [0, 2, 3, 4]  # copy of block 1, then two new blocks for 13 tokens
    assert allocator.copies == 1 and allocator.lengths["c"] == 13
    allocator.check()


def test_appending_to_a_full_shared_block_needs_no_copy():
    allocator = BlockAllocator(num_blocks=6, block_size=4)
    allocator.allocate("p", 8)  # two full blocks
    allocator.fork("p", "c")
    assert allocator.append("c", 1) == [0, 1, 2]
    assert allocator.copies == 0 and allocator.refcount[:3] == [2, 2, 1]
    allocator.check()


def test_fork_of_an_empty_sequence_then_append():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    allocator.allocate("p", 0)
    allocator.fork("p", "c")
    assert allocator.append("c", 2) == [0] and allocator.tables["p"] == [] and allocator.copies == 0
    allocator.check()


# ---- random operations --------------------------------------------------------------------

class Memory:
    """What the allocator stands for: token slots in blocks. Each token is written through the
    block table and read back; copy-on-write copies a block's contents when the table swaps it."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.slots = {b: [None] * allocator.block_size for b in range(allocator.num_blocks)}
        self.expected = {}  # seq -> the tokens it should read back
        self.serial = 0

    def write(self, seq, start, stop):
        size = self.allocator.block_size
        table = self.allocator.tables[seq]
        for t in range(start, stop):
            self.serial += 1
            self.slots[table[t // size]][t % size] = self.serial
            self.expected[seq].append(self.serial)

    def read(self, seq):
        size = self.allocator.block_size
        table = self.allocator.tables[seq]
        return [self.slots[table[t // size]][t % size] for t in range(self.allocator.lengths[seq])]


def run_random_operations(seed, steps=300, num_blocks=40, block_size=4):
    rng = random.Random(seed)
    allocator = BlockAllocator(num_blocks=num_blocks, block_size=block_size)
    memory = Memory(allocator)
    names = [f"s{i}" for i in range(30)]
    done = {"allocate": 0, "append": 0, "fork": 0, "free": 0, "refused": 0, "copied": 0}
    for _ in range(steps):
        live = sorted(allocator.tables)
        kind = rng.choice(["allocate", "allocate", "append", "append", "append", "fork", "free", "misuse"])
        if kind in ("append", "fork", "free") and not live:
            kind = "allocate"
        before = snapshot(allocator)
        try:
            if kind == "allocate":
                seq = rng.choice(names)
                tokens = rng.randint(0, 24)
                allocator.allocate(seq, tokens)
                memory.expected[seq] = []
                memory.write(seq, 0, tokens)
            elif kind == "append":
                seq = rng.choice(live)
                old_table, old_length = list(allocator.tables[seq]), allocator.lengths[seq]
                copies = allocator.copies
                count = rng.randint(1, 9)
                table = allocator.append(seq, count)
                assert table[:max(len(old_table) - 1, 0)] == old_table[:-1]  # only the last block may be swapped
                if old_table and table[len(old_table) - 1] != old_table[-1]:
                    assert allocator.copies == copies + 1
                    memory.slots[table[len(old_table) - 1]] = list(memory.slots[old_table[-1]])
                    done["copied"] += 1
                else:
                    assert allocator.copies == copies
                memory.write(seq, old_length, old_length + count)
            elif kind == "fork":
                parent, child = rng.choice(live), rng.choice(names)
                allocator.fork(parent, child)
                memory.expected[child] = list(memory.expected[parent])
            elif kind == "free":
                seq = rng.choice(live)
                allocator.free_sequence(seq)
                del memory.expected[seq]
            else:  # unknown or freed names, and names already in use
                op = rng.choice(["append", "fork", "free_sequence", "allocate"])
                if op == "allocate" and live:
                    allocator.allocate(rng.choice(live), 1)
                else:
                    gone = rng.choice([n for n in names if n not in allocator.tables] or ["nobody"])
                    {"append": lambda: allocator.append(gone, 1), "fork": lambda: allocator.fork(gone, "x"),
                     "free_sequence": lambda: allocator.free_sequence(gone),
                     "allocate": lambda: allocator.free_sequence(gone)}[op]()
                raise AssertionError(f"misuse {op} was accepted")
            done[kind] += 1
        except AllocatorError:
            assert snapshot(allocator) == before, f"a refused {kind} changed the allocator"
            done["refused"] += 1
        allocator.check()
        assert allocator.used_blocks == len({b for t in allocator.tables.values() for b in t})
        assert set(allocator.tables) == set(memory.expected)
        for seq in allocator.tables:
            assert memory.read(seq) == memory.expected[seq], f"{seq} reads back tokens it did not write"
    return done


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_the_books_straight(seed):
    done = run_random_operations(seed)
    # the run exercised every kind of operation, refusals and copies included
    assert all(done[k] > 0 for k in ("allocate", "append", "fork", "free", "refused")), done


def test_random_operations_exercise_copy_on_write_and_running_out():
    totals = {}
    for seed in range(6):
        for k, v in run_random_operations(seed).items():
            totals[k] = totals.get(k, 0) + v
    assert totals["copied"] > 0 and totals["refused"] > 20, totals


# ---- misuse -------------------------------------------------------------------------------

def test_double_free_and_unknown_sequences_are_refused():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("a", 5)
    allocator.allocate("b", 3)
    allocator.free_sequence("a")
    refused(allocator, "free_sequence", "a", match="unknown sequence 'a'")
    refused(allocator, "append", "ghost", 1, match="unknown sequence 'ghost'")
    refused(allocator, "fork", "ghost", "child", match="unknown sequence 'ghost'")
    refused(allocator, "free_sequence", "ghost", match="unknown sequence 'ghost'")
    assert "child" not in allocator.tables


def test_existing_names_are_refused():
    allocator = BlockAllocator(num_blocks=8, block_size=4)
    allocator.allocate("a", 5)
    allocator.allocate("b", 3)
    refused(allocator, "allocate", "a", 1, match="sequence 'a' already exists")
    refused(allocator, "fork", "a", "b", match="sequence 'b' already exists")
    refused(allocator, "fork", "a", "a", match="sequence 'a' already exists")


def test_out_of_blocks_on_allocate():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    allocator.allocate("a", 9)  # 3 blocks
    refused(allocator, "allocate", "b", 5, match=r"out of blocks: 'b' needs 2 for 5 tokens, 1 free")
    assert allocator.allocate("b", 4) == [3]  # exactly the last block still fits


def test_out_of_blocks_on_append():
    allocator = BlockAllocator(num_blocks=3, block_size=4)
    allocator.allocate("a", 8)
    allocator.allocate("b", 1)
    refused(allocator, "append", "a", 5, match=r"out of blocks: 'a' needs 2 more, 0 free")
    assert allocator.append("b", 3) == [2]  # filling a block needs none


def test_out_of_blocks_when_copy_on_write_needs_one_more():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    allocator.allocate("p", 6)  # blocks 0, 1 (half full)
    allocator.fork("p", "c")
    allocator.allocate("x", 4)  # block 2; one block left
    # 6 + 3 = 9 tokens: one new block plus a copy of the shared block 1: two, with one free
    refused(allocator, "append", "c", 3, match=r"out of blocks: 'c' needs 2 more, 1 free")
    refused(allocator, "append", "p", 3, match=r"out of blocks: 'p' needs 2 more, 1 free")
    assert allocator.append("c", 2) == [0, 3]  # the copy alone fits
    assert allocator.copies == 1
    allocator.check()


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (-1, 4), (4, 0), (4, -2), (4.0, 4), (True, 4)])
def test_bad_sizes_raise_value_error(num_blocks, block_size):
    with pytest.raises(ValueError, match="num_blocks|block_size"):
        BlockAllocator(num_blocks=num_blocks, block_size=block_size)


def test_negative_or_zero_tokens_raise_value_error_and_change_nothing():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    allocator.allocate("a", 2)
    before = snapshot(allocator)
    with pytest.raises(ValueError, match="tokens"):
        allocator.blocks_needed(-1)
    with pytest.raises(ValueError, match="tokens"):
        allocator.allocate("b", -3)
    with pytest.raises(ValueError, match="tokens"):
        allocator.append("a", -1)
    with pytest.raises(ValueError, match="tokens"):
        allocator.append("a", 0)
    assert snapshot(allocator) == before
    allocator.check()


# ---- the self-check -------------------------------------------------------------------------

def small_shared_state():
    allocator = BlockAllocator(num_blocks=6, block_size=4)
    allocator.allocate("p", 6)
    allocator.fork("p", "c")
    allocator.allocate("q", 3)
    allocator.check()
    return allocator


def test_check_detects_a_wrong_refcount():
    allocator = small_shared_state()
    allocator.refcount[0] += 1
    with pytest.raises(AssertionError, match="block 0: refcount 3, held by 2"):
        allocator.check()


def test_check_detects_a_used_block_on_the_free_list():
    allocator = small_shared_state()
    allocator.free.append(2)
    with pytest.raises(AssertionError, match="block 2 is both free and used"):
        allocator.check()


def test_check_detects_a_lost_block():
    allocator = small_shared_state()
    allocator.free.remove(5)
    with pytest.raises(AssertionError, match="block 5 is neither free nor used"):
        allocator.check()


def test_check_detects_a_block_listed_free_twice():
    allocator = small_shared_state()
    allocator.free.append(allocator.free[0])
    with pytest.raises(AssertionError, match="free list twice"):
        allocator.check()


def test_check_detects_a_table_that_does_not_match_the_length():
    allocator = small_shared_state()
    allocator.lengths["q"] = 5
    with pytest.raises(AssertionError, match="'q' has 1 blocks for 5 tokens"):
        allocator.check()
