"""Checkers for the lesson 05 exercises (decode is memory-bound). Each takes the student's function.

References: ``helpers.paged_kv`` and ``helpers.roofline``; random cases are seeded.
"""

from __future__ import annotations

import math
import random

from helpers.checks.core import CheckFailed, WrongType, as_float, as_int, as_numbers, check_function, close
from helpers.paged_kv import BlockAllocator


def blocks_for(fn, seed: int = 1, n_random: int = 20) -> None:
    """Exercise 1: blocks a sequence of ``tokens`` tokens holds."""
    rng = random.Random(seed)
    cases = [(1, 16), (16, 16), (17, 16), (0, 16), (1000, 1), (4096, 128)]
    cases += [(rng.randint(0, 10_000), rng.choice([1, 8, 16, 32, 64, 128, 256])) for _ in range(n_random)]

    def diagnose(args, expected, got):
        tokens, block = args
        if got == tokens // block:
            return "floor division drops the last, partly filled block: round up"
        return None
    check_function(fn, lambda tokens, block: math.ceil(tokens / block), cases, name="blocks_for",
                   params=("tokens", "block_size"), diagnose=diagnose,
                   hint="a block holds block_size tokens, and a partly filled block is still a whole block: "
                        "ceil(tokens / block_size) (lesson 05, section 4).")


def _waste_reference(lengths, block_size, reserve):
    tokens = sum(lengths)
    paged = sum(math.ceil(n / block_size) * block_size for n in lengths)
    return 1 - tokens / (reserve * len(lengths)), 1 - tokens / paged


def waste(fn, seed: int = 2, n_random: int = 20) -> None:
    """Exercise 2: the share of reserved slots that hold no token, contiguous and paged."""
    rng = random.Random(seed)
    cases = [([100, 2000, 37], 16, 2048), ([16, 32], 16, 64), ([1], 256, 4096), ([4096], 16, 4096)]
    cases += [([rng.randint(1, 4000) for _ in range(rng.randint(1, 30))], rng.choice([8, 16, 32, 128]), 4096)
              for _ in range(n_random)]

    def diagnose(args, expected, got):
        if math.isclose(got[0], 1 - expected[0], rel_tol=1e-9) or math.isclose(got[1], 1 - expected[1], rel_tol=1e-9):
            return "that is the share that holds tokens; waste is 1 minus it"
        return None
    check_function(fn, _waste_reference, cases, name="waste", params=("lengths", "block_size", "reserve"),
                   convert=as_numbers(2, "fractions (contiguous, paged)"), compare=close(), diagnose=diagnose,
                   hint="waste = 1 - tokens / reserved slots; contiguous reserves `reserve` slots per sequence, "
                        "paged holds ceil(n / block_size) * block_size slots (lesson 05, section 4).")


def _state(value):
    if not isinstance(value, (tuple, list)) or len(value) != 3 or not isinstance(value[0], list) \
            or not isinstance(value[2], list):
        raise WrongType(f"{value!r}; expected a triple (table, length, free) with table and free lists of block ids")
    return list(value[0]), as_int(value[1]), list(value[2])


def _drop_cases(seed: int, n_random: int) -> list[tuple]:
    rng = random.Random(seed)
    cases = [([7, 3], 6, [5], 2, 4),  # within the last block: no block leaves
             ([7, 3], 6, [5], 3, 4),  # 3 tokens left, all in block 7: block 3 leaves
             ([7, 3, 9], 9, [], 5, 4),  # 4 tokens left fill block 7 exactly: 3 and 9 leave, 9 first
             ([7, 3], 6, [5], 6, 4),  # everything: the table empties
             ([7], 3, [5], 0, 4),  # nothing dropped
             ([4, 8, 1], 5, [0], 2, 2)]  # 3 tokens left need 2 blocks of 2: block 1 leaves
    for _ in range(n_random):
        block = rng.choice([1, 2, 4, 16])
        length = rng.randint(0, 40)
        blocks = list(range(100))
        rng.shuffle(blocks)
        need = math.ceil(length / block)
        cases.append((blocks[:need], length, blocks[need:need + rng.randint(0, 4)], rng.randint(0, length), block))
    return cases


def _drop_reference(table, length, free, count, block_size):
    """BlockAllocator.truncate on a sequence with this table and this free list."""
    allocator = BlockAllocator(num_blocks=1 + max(table + free, default=0), block_size=block_size)
    allocator.free = list(free)
    allocator.tables["s"], allocator.lengths["s"] = list(table), length
    for block in table:
        allocator.refcount[block] = 1
    return allocator.truncate("s", count), length - count, allocator.free


def drop_tokens(fn, seed: int = 3, n_random: int = 20) -> None:
    """Exercise 3: one allocator step back: a sequence loses its last ``count`` tokens."""
    def compare(expected, got, args):
        for name, e, g in zip(("table", "length", "free list"), expected, got):
            if g != e:
                return f"returned {name} {g!r}, expected {e!r}"
        return None

    def diagnose(args, expected, got):
        table, length, free, count, block = args
        if count > 0 and got[1] == length + count:
            return "the length goes down by count: length - count"
        kept = len(got[0])
        if kept == (length - count) // block and kept < len(expected[0]):
            return ("floor division drops the last, partly filled block: the tokens left need "
                    "ceil((length - count) / block_size) blocks")
        released = table[len(expected[0]):]
        if got[0] == expected[0] and got[2] == list(free) + released:
            return ("the released blocks go back to the free list last block first (free + released[::-1]), so "
                    "that growing again pops them back in order")
        return None

    def refuses(call_args, why):
        call = "drop_tokens(table={}, length={}, free={}, count={}, block_size={})".format(*call_args)
        try:
            fn(*call_args)
        except ValueError:
            return
        except Exception as error:
            raise CheckFailed(f"{call} raised {type(error).__name__}; {why}: raise ValueError") from None
        raise CheckFailed(f"{call} returned; {why}: raise ValueError instead")

    def returns_new_lists():
        for table, length, free, count in (([7, 3], 6, [5], 3), ([7], 3, [5], 1), ([7], 3, [5], 0)):  # a block leaves; none
            call = f"drop_tokens(table={table}, length={length}, free={free}, count={count}, block_size=4)"
            before = (list(table), list(free))
            result = fn(table, length, free, count, 4)
            if (table, free) != before:
                raise CheckFailed(f"{call} changed the lists it was given (table became {table}, free became {free}); "
                                  "the task asks for new lists: build them (table[:keep], free + released[::-1]) "
                                  "and leave the caller's lists as they were")
            if result[0] is table or result[2] is free:
                raise CheckFailed(f"{call} returned a list it was given, not a new one; the task asks for new lists "
                                  "(list(table), list(free))")

    def then():
        refuses(([7, 3], 6, [5], 7, 4), "the sequence holds only 6 tokens")
        refuses(([7, 3], 6, [5], -1, 4), "a count below 0 is not a number of tokens")
        returns_new_lists()

    check_function(lambda table, length, free, count, block_size: fn(list(table), length, list(free), count,
                                                                      block_size),
                   _drop_reference, _drop_cases(seed, n_random), name="drop_tokens",
                   params=("table", "length", "free", "count", "block_size"), convert=_state, compare=compare,
                   diagnose=diagnose, then=then,
                   hint="the tokens left need ceil((length - count) / block_size) blocks; the blocks after those "
                        "leave the table and are appended to the free list last block first (lesson 05, section 4).")


def _ceiling_reference(bandwidth, weight_bytes, cache_bytes_per_token, context, batch):
    return batch * bandwidth / (weight_bytes + batch * context * cache_bytes_per_token)


def decode_ceiling(fn, seed: int = 4, n_random: int = 20) -> None:
    """Exercise 4: the memory-bound tokens/s ceiling for a batch."""
    rng = random.Random(seed)
    cases = [(3.35e12, 16_060_522_496, 131_072, 4096, 1), (3.35e12, 16_060_522_496, 131_072, 4096, 64),
             (2.039e12, 13_476_831_232, 524_288, 1024, 8), (89.6e9, 16_060_522_496, 65_536, 8192, 1)]
    cases += [(rng.choice([89.6e9, 1.555e12, 2.039e12, 3.35e12, 4.8e12]), rng.randint(10**8, 10**12),
               rng.randint(1000, 10**6), rng.randint(1, 131072), rng.randint(1, 256)) for _ in range(n_random)]

    def diagnose(args, expected, got):
        bandwidth, weights, per_token, context, batch = args
        if math.isclose(got, bandwidth / (weights + batch * context * per_token), rel_tol=1e-9):
            return "each step produces one token for every sequence of the batch: multiply by batch"
        if math.isclose(got, bandwidth / (weights + context * per_token), rel_tol=1e-9):
            return ("that is one sequence's rate: either the batch is left out everywhere, or the weights are counted "
                    "once per sequence; they are read once per step for the whole batch, and each step makes batch tokens")
        return None
    check_function(fn, _ceiling_reference, cases, name="decode_ceiling",
                   params=("bandwidth", "weight_bytes", "cache_bytes_per_token", "context", "batch"),
                   convert=as_float, compare=close(), diagnose=diagnose,
                   hint="bytes per step = weights (once) + batch x context x cache bytes per token; tokens/s = "
                        "batch x bandwidth / bytes per step (lesson 05, section 2).")

