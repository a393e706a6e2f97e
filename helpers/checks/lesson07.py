"""Checkers for exercises 07 (the serving engine). Every reference is the engine itself
(``helpers.engine.Engine.schedule``, ``helpers.prefix_cache.PrefixCachingAllocator.lookup``), run
on a state built from the exercise's arguments."""

from __future__ import annotations

import random
from functools import lru_cache

import torch

from helpers.checks.core import WrongType, as_int, check_function
from helpers.engine import Engine, Request
from helpers.llama import LlamaConfig, LlamaForCausalLM
from helpers.prefix_cache import PrefixCachingAllocator, block_hash, prefix_hashes


@lru_cache(maxsize=1)
def _model() -> LlamaForCausalLM:
    """A one-layer model: the scheduler only reads its shape."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=8, layers=1, hidden=8, q_heads=1, kv_heads=1, head_dim=8,
                                        intermediate=8, max_positions=4096)).eval()


def _engine_plan(running, waiting, token_budget, max_batch, free_blocks=None, block_size=16):
    """The engine's schedule for requests given as (name, tokens still to feed); with ``free_blocks``,
    a pool holding exactly that many free blocks (and no prefix cache)."""
    num_blocks = 4096 if free_blocks is None else free_blocks + 1
    engine = Engine(_model(), num_blocks=num_blocks, block_size=block_size, max_batch=max_batch,
                    token_budget=token_budget, prefix_caching=False)
    engine.blocks.allocate("held by others", 0 if free_blocks is None else 1)
    for name, pending in running:
        engine.blocks.allocate(name, 0)
        engine.running.append(Request(name, [1] * pending, 1))
    engine.waiting = [Request(name, [1] * pending, 1) for name, pending in waiting]
    plan, _, _ = engine.schedule()
    return [(request.rid, n) for request, n in plan]


def _plan(value):
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise WrongType(f"{value!r}; expected a list of (name, tokens) pairs")
    try:
        return [(name, as_int(n)) for name, n in value]
    except WrongType as problem:
        raise WrongType(f"a list whose token counts are not all ints: {problem}") from None


def _queue(rng, prefix, count, decode_share):
    return [(f"{prefix}{i}", 1 if rng.random() < decode_share else rng.randint(1, 60)) for i in range(count)]


def _schedule_cases(seed, n_random):
    rng = random.Random(seed)
    cases = [([("a", 1), ("b", 1)], [("c", 10)], 8, 4),  # decodes first, then a chunk of c's prompt
             ([("a", 1), ("b", 1)], [("c", 10), ("d", 3)], 100, 4),  # everyone fits
             ([("a", 1), ("b", 1)], [("c", 10), ("d", 3)], 100, 3),  # one free place in the batch
             ([("a", 30)], [("b", 5)], 16, 4),  # a prompt mid-prefill takes the whole budget
             ([("a", 1), ("b", 1), ("c", 1)], [("d", 4)], 2, 8),  # budget runs out among the running
             ([], [("a", 5), ("b", 5), ("c", 5)], 12, 8),  # c gets what is left: 2 tokens
             ([], [], 8, 4)]
    for _ in range(n_random):
        running = _queue(rng, "r", rng.randint(0, 5), 0.7)
        cases.append((running, _queue(rng, "w", rng.randint(0, 5), 0.0), rng.randint(1, 80),
                      rng.randint(max(len(running), 1), 8)))
    return cases


def schedule_step(fn, seed: int = 1, n_random: int = 30) -> None:
    """Exercise 1: one scheduler step under a token budget and a batch limit (no blocks)."""
    def diagnose(args, expected, got):
        running, waiting, budget, max_batch = args
        if sum(n for _, n in got) > budget:
            return f"the plan feeds {sum(n for _, n in got)} tokens, more than the budget of {budget}"
        if [name for name, _ in got] == [name for name, _ in expected] and got != expected:
            return "the right requests, wrong counts: each gets min(its tokens still to feed, the budget left)"
        if any(n == 0 for _, n in got):
            return "a request fed 0 tokens is not in the plan: stop once the budget is spent"
        admitted = [name for name, _ in got if name not in dict(running)]
        if len(running) + len(admitted) > max_batch:
            return (f"{len(running)} running plus {len(admitted)} admitted is over max_batch={max_batch}: the running "
                    "requests count even when the budget skipped them")
        if got and got[0][0] not in dict(running) and running:
            return "running requests come first (they hold cache memory and may be mid-answer), then the queue"
        return None

    check_function(lambda running, waiting, budget, batch: fn([tuple(r) for r in running], [tuple(w) for w in waiting],
                                                              budget, batch),
                   _engine_plan, _schedule_cases(seed, n_random), name="schedule_step",
                   params=("running", "waiting", "token_budget", "max_batch"), convert=_plan, diagnose=diagnose,
                   hint="running first, in order, each fed min(pending, budget left); then the waiting ones in order "
                        "while the budget lasts and the batch holds fewer than max_batch (lesson 07, section 2).")


def _lookup_reference(tokens, block_size, cache):
    allocator = PrefixCachingAllocator(num_blocks=1 + max(cache.values(), default=0), block_size=block_size)
    allocator.cached = dict(cache)
    return allocator.lookup(tokens, (len(tokens) - 1) // block_size)


def _lookup_cases(seed, n_random):
    rng = random.Random(seed)
    system = [5, 6, 7, 8, 9, 10, 11, 12]
    stored = system + [20, 21, 22, 23]
    cache = {key: 40 + i for i, key in enumerate(prefix_hashes(stored, 4))}  # blocks 40, 41, 42
    cases = [(system + [1, 2, 3], 4, cache),  # the system prompt's two blocks
             (stored + [1], 4, cache),  # all three
             (stored, 4, cache),  # 12 tokens: the last must be computed, so 2 blocks
             ([9] + system, 4, cache),  # shifted by one token: nothing
             ([5, 6, 7, 8, 0, 0, 0, 0, 20, 21, 22, 23, 1], 4, cache),  # stops at the first miss
             (system + [1], 8, cache),  # another block size: other keys
             ([1, 2], 4, {})]
    for _ in range(n_random):
        block = rng.choice([2, 3, 4, 8])
        base = [rng.randint(0, 9) for _ in range(rng.randint(0, 5) * block)]
        cached = {key: rng.randint(0, 99) for key in prefix_hashes(base, block)[:rng.randint(0, 5)]}
        tokens = base[:rng.randint(0, len(base))] + [rng.randint(0, 9) for _ in range(rng.randint(1, 2 * block))]
        cases.append((tokens, block, cached))
    return cases


def cached_prefix(fn, seed: int = 2, n_random: int = 30) -> None:
    """Exercise 2: the prefix-cache lookup by chained block hashes."""
    def diagnose(args, expected, got):
        tokens, block, cache = args
        if len(got) == len(expected) + 1 and got[:-1] == expected:
            return ("the last token must still be fed, to give the logits of the next one: look up at most "
                    "(len(tokens) - 1) // block_size blocks")
        if len(got) > len(expected) and got[:len(expected)] == expected:
            return "stop at the first block that is not in the cache: a later block's key includes it"
        unchained = []
        for start in range(0, (len(tokens) - 1) // block * block, block):
            key = block_hash(None, tokens[start:start + block])
            if key not in cache:
                break
            unchained.append(cache[key])
        if got == unchained:
            return ("each block's key is block_hash(previous block's key, its tokens), starting from None: the "
                    "previous block's key chains the whole prefix into it")
        return None

    def convert(value):
        if not isinstance(value, (list, tuple)):
            raise WrongType(f"{value!r}; expected a list of block ids")
        return [as_int(v) for v in value]

    check_function(lambda tokens, block, cache: fn(list(tokens), block, dict(cache)), _lookup_reference,
                   _lookup_cases(seed, n_random), name="cached_prefix", params=("tokens", "block_size", "cache"),
                   convert=convert, diagnose=diagnose,
                   hint="walk the full blocks in order, key = block_hash(previous key, block's tokens), starting at "
                        "None; stop at the first key not in cache, and at (len(tokens) - 1) // block_size blocks "
                        "(lesson 07, section 4).")


def _admit_reference(waiting, free_blocks, block_size, token_budget, slots):
    return _engine_plan([], waiting, token_budget, slots, free_blocks, block_size)


def _admit_cases(seed, n_random):
    rng = random.Random(seed)
    cases = [([("a", 20), ("b", 10)], 4, 8, 100, 4),  # a: 3 blocks, b: 2 more than the 1 left, so b waits
             ([("a", 20), ("b", 10), ("c", 3)], 4, 8, 100, 4),  # c would fit, but no one overtakes b
             ([("a", 20), ("b", 10)], 10, 8, 100, 1),  # one place in the batch
             ([("a", 50)], 2, 8, 16, 4),  # the first chunk (16 tokens, 2 blocks) fits, not the whole prompt
             ([("a", 9)], 1, 8, 100, 4),  # 9 tokens need 2 blocks of 8
             ([("a", 8), ("b", 8)], 2, 8, 12, 4),  # b gets the 4 tokens left: 1 block
             ([("a", 5)], 0, 4, 10, 4)]  # no block free: no one
    for _ in range(n_random):
        waiting = [(f"w{i}", rng.randint(1, 70)) for i in range(rng.randint(0, 6))]
        cases.append((waiting, rng.randint(0, 12), rng.choice([1, 4, 8, 16]), rng.randint(1, 100), rng.randint(1, 6)))
    return cases


def admit(fn, seed: int = 3, n_random: int = 30) -> None:
    """Exercise 3: admitting waiting requests under a block budget."""
    def variant(args, blocks_of, stop_at_misfit=True):
        waiting, free, block, budget, slots = args
        plan = []
        for name, tokens in waiting:
            n = min(tokens, budget)
            if not budget or len(plan) == slots:
                break
            if blocks_of(tokens, n, block) > free:
                if stop_at_misfit:
                    break
                continue
            plan.append((name, n))
            budget, free = budget - n, free - blocks_of(tokens, n, block)
        return plan

    def diagnose(args, expected, got):
        if got == variant(args, lambda tokens, n, block: -(-n // block), stop_at_misfit=False):
            return ("a request that does not fit stops the admissions: the ones behind it wait too (first come, "
                    "first served), even when they would fit")
        if got == variant(args, lambda tokens, n, block: -(-tokens // block)):
            return "a request needs blocks only for the tokens fed this step (its first chunk), not its whole prompt"
        if got == variant(args, lambda tokens, n, block: n // block + 1) or \
                got == variant(args, lambda tokens, n, block: n // block):
            return "n tokens fill ceil(n / block_size) blocks, not n // block_size (+ 1)"
        return None

    check_function(lambda waiting, free, block, budget, slots: fn([tuple(w) for w in waiting], free, block, budget,
                                                                  slots),
                   _admit_reference, _admit_cases(seed, n_random), name="admit",
                   params=("waiting", "free_blocks", "block_size", "token_budget", "slots"), convert=_plan,
                   diagnose=diagnose,
                   hint="in order: n = min(tokens, budget left) tokens need ceil(n / block_size) blocks; admit while "
                        "they fit in the free blocks, a place is left and budget remains; stop at the first that "
                        "does not fit (lesson 07, section 5).")
