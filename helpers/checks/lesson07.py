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


def _cause(student, cases, args, got, causes) -> str | None:
    """The mistake that explains the student's answers: ``causes`` is [(text, wrong(*case))]. A cause
    that gives the student's answer on every case wins; else the one cause that gives ``got`` on this
    case; else none (no guessing between several)."""
    def answers(case):
        try:
            return _plan_or_list(student(*case))
        except Exception:
            return None
    theirs = [answers(case) for case in cases]  # each case run once more, then compared with every cause
    everywhere = [text for text, wrong in causes if all(t == wrong(*case) for t, case in zip(theirs, cases))]
    if len(everywhere) == 1:
        return everywhere[0]
    here = [text for text, wrong in causes if wrong(*args) == got]
    return here[0] if len(here) == 1 else None


def _plan_or_list(value):
    try:
        return _plan(value)
    except WrongType:
        return list(value) if isinstance(value, (list, tuple)) else value


def _schedule_cases(seed, n_random):
    rng = random.Random(seed)
    cases = [([("a", 1), ("b", 1)], [("c", 10)], 8, 4),  # decodes, then a chunk of c's prompt
             ([("a", 1), ("b", 1)], [("c", 10), ("d", 3)], 100, 4),  # everyone fits
             ([("a", 1), ("b", 1)], [("c", 10), ("d", 3)], 100, 3),  # one free place in the batch
             ([("a", 30)], [("b", 5)], 16, 4),  # a prompt part-way through takes the whole budget
             ([("a", 30), ("b", 1)], [], 16, 4),  # b decodes first, though a is older
             ([("a", 40), ("b", 1), ("c", 1)], [("d", 8)], 10, 4),  # 2 decodes, then 8 of a's prompt
             ([("a", 1), ("b", 1), ("c", 1)], [("d", 4)], 2, 8),  # budget runs out among the running
             ([], [("a", 5), ("b", 5), ("c", 5)], 12, 8),  # c gets what is left: 2 tokens
             ([], [], 8, 4)]
    for _ in range(n_random):
        running = _queue(rng, "r", rng.randint(0, 5), 0.7)
        cases.append((running, _queue(rng, "w", rng.randint(0, 5), 0.0), rng.randint(1, 80),
                      rng.randint(max(len(running), 1), 8)))
    return cases


def _fill(queue, budget, room=None):
    """Feed ``queue`` in order: min(pending, budget left) each, while budget (and room) lasts."""
    plan = []
    for name, pending in queue:
        if budget == 0 or (room is not None and len(plan) == room):
            break
        plan.append((name, min(pending, budget)))
        budget -= plan[-1][1]
    return plan, budget


def _running_in_order(running, waiting, budget, max_batch):
    """The mistake of feeding the running requests in their order, decoding ones not first."""
    plan, left = _fill(running, budget)
    return plan + _fill(waiting, left, max_batch - len(running))[0]


def _decodes_then_rest(running):
    return [r for r in running if r[1] == 1] + [r for r in running if r[1] != 1]


def _running_not_counted(running, waiting, budget, max_batch):
    """The mistake of letting max_batch waiting requests join, whatever is running."""
    plan, left = _fill(_decodes_then_rest(running), budget)
    return plan + _fill(waiting, left, max_batch)[0]


def _one_over(running, waiting, budget, max_batch):
    """The mistake of admitting while running + admitted <= max_batch."""
    plan, left = _fill(_decodes_then_rest(running), budget)
    return plan + _fill(waiting, left, max_batch - len(running) + 1)[0]


def _queue_first(running, waiting, budget, max_batch):
    """The mistake of admitting the waiting requests before feeding the running ones."""
    plan, left = _fill(waiting, budget, max_batch - len(running))
    return plan + _fill(_decodes_then_rest(running), left)[0]


def schedule_step(fn, seed: int = 1, n_random: int = 30) -> None:
    """Exercise 1: one scheduler step under a token budget and a batch limit (no blocks)."""
    def diagnose(args, expected, got):
        running, waiting, budget, max_batch = args
        if sum(n for _, n in got) > budget:
            return f"the plan feeds {sum(n for _, n in got)} tokens, more than the budget of {budget}"
        if any(n == 0 for _, n in got):
            return "a request fed 0 tokens is not in the plan: stop once the budget is spent"
        return _cause(student, cases, args, got, [
            ("the running requests were not counted in the batch: waiting ones join only while running + "
             "admitted < max_batch (every running request holds a place)", _running_not_counted),
            ("one request too many joins: stop admitting when running + admitted reaches max_batch",
             _one_over),
            ("decoding requests (1 token to feed) come first, then those part-way through a prompt, each group in "
             "order: a long prompt must not hold back everyone's next token", _running_in_order),
            ("running requests come first (they hold cache memory and may be mid-answer), then the queue",
             _queue_first)])

    student = lambda running, waiting, budget, batch: fn([tuple(r) for r in running],  # noqa: E731
                                                         [tuple(w) for w in waiting], budget, batch)
    cases = _schedule_cases(seed, n_random)
    check_function(student, _engine_plan, cases, name="schedule_step",
                   params=("running", "waiting", "token_budget", "max_batch"), convert=_plan, diagnose=diagnose,
                   hint="the running requests with 1 token to feed, then the other running ones, then the waiting "
                        "ones, each in order and fed min(pending, budget left), while the budget lasts; waiting ones "
                        "only while running + admitted < max_batch (lesson 07, section 2).")


class _Keys(dict):
    """A cache dict shown with its keys cut to 8 characters (SHA-256 keys fill a line each)."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"'{key[:8]}…': {block}" for key, block in self.items()) + "}"


def _lookup_reference(tokens, block_size, cache):
    allocator = PrefixCachingAllocator(num_blocks=1 + max(cache.values(), default=0), block_size=block_size)
    allocator.cached = dict(cache)
    return allocator.lookup(tokens, (len(tokens) - 1) // block_size)


def _lookup_cases(seed, n_random):
    rng = random.Random(seed)
    system = [5, 6, 7, 8, 9, 10, 11, 12]
    stored = system + [20, 21, 22, 23]
    keys = prefix_hashes(stored, 4)
    cache = _Keys({key: 40 + i for i, key in enumerate(keys)})  # blocks 40, 41, 42
    gap = _Keys({keys[0]: 40, keys[2]: 42})  # the middle block was evicted: block 42 cannot be reached
    cases = [(system + [1, 2, 3], 4, cache),  # the system prompt's two blocks
             (stored + [1], 4, cache),  # all three
             (stored, 4, cache),  # 12 tokens: the last must be computed, so 2 blocks
             ([9] + system, 4, cache),  # shifted by one token: nothing
             ([5, 6, 7, 8, 0, 0, 0, 0, 20, 21, 22, 23, 1], 4, cache),  # the second block differs
             (stored + [1], 4, gap),  # stops at the first miss, though the third key is there
             (system + [1], 8, cache),  # another block size: other keys
             ([1, 2], 4, _Keys())]
    for _ in range(n_random):
        block = rng.choice([2, 3, 4, 8])
        base = [rng.randint(0, 9) for _ in range(rng.randint(0, 5) * block)]
        cached = {key: rng.randint(0, 99) for key in prefix_hashes(base, block)[:rng.randint(0, 5)]}
        if len(cached) > 2 and rng.random() < 0.5:  # an evicted block in the middle
            del cached[list(cached)[rng.randrange(1, len(cached) - 1)]]
        tokens = base[:rng.randint(0, len(base))] + [rng.randint(0, 9) for _ in range(rng.randint(1, 2 * block))]
        cases.append((tokens, block, _Keys(cached)))
    return cases


def _walk(tokens, block, cache, limit, chained=True, stop=True):
    found, key = [], None
    for start in range(0, max(limit, 0) * block, block):
        key = block_hash(key if chained else None, tokens[start:start + block])
        if key in cache:
            found.append(cache[key])
        elif stop:
            break
    return found


def cached_prefix(fn, seed: int = 2, n_random: int = 30) -> None:
    """Exercise 2: the prefix-cache lookup by chained block hashes."""
    def diagnose(args, expected, got):
        tokens, block, cache = args
        return _cause(student, cases, args, got, [
            ("the last token must still be fed, to give the logits of the next one: look up at most "
             "(len(tokens) - 1) // block_size blocks", lambda t, b, c: _walk(t, b, c, len(t) // b)),
            ("one block short: look up (len(tokens) - 1) // block_size blocks, not one fewer",
             lambda t, b, c: _walk(t, b, c, (len(t) - 1) // b - 1)),
            ("stop at the first block that is not in the cache: the blocks after it are no use without it",
             lambda t, b, c: _walk(t, b, c, (len(t) - 1) // b, stop=False)),
            ("each block's key is block_hash(previous block's key, its tokens), starting from None: the previous "
             "key chains the whole prefix into it", lambda t, b, c: _walk(t, b, c, (len(t) - 1) // b, chained=False))])

    student = lambda tokens, block, cache: fn(list(tokens), block, dict(cache))  # noqa: E731
    cases = _lookup_cases(seed, n_random)

    def convert(value):
        if not isinstance(value, (list, tuple)):
            raise WrongType(f"{value!r}; expected a list of block ids")
        return [as_int(v) for v in value]

    check_function(student, _lookup_reference, cases, name="cached_prefix", params=("tokens", "block_size", "cache"),
                   convert=convert, diagnose=diagnose,
                   hint="walk the full blocks in order, key = block_hash(previous key, block's tokens), starting at "
                        "None; stop at the first key not in cache, and at (len(tokens) - 1) // block_size blocks "
                        "(lesson 07, section 5).")


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
    def variant(args, blocks_of, stop_at_misfit=True, use_slots=True, spend=True):
        waiting, free, block, budget, slots = args
        plan = []
        for name, tokens in waiting:
            n = min(tokens, budget)
            if not budget or (use_slots and len(plan) == slots):
                break
            if blocks_of(tokens, n, block) > free:
                if stop_at_misfit:
                    break
                continue
            plan.append((name, n))
            budget, free = budget - n, free - blocks_of(tokens, n, block) * spend
        return plan

    def diagnose(args, expected, got):
        ceil = lambda tokens, n, block: -(-n // block)  # noqa: E731
        return _cause(student, cases, args, got, [
            ("a request that does not fit stops the admissions: the ones behind it wait too (first come, first "
             "served), even when they would fit", lambda *case: variant(case, ceil, stop_at_misfit=False)),
            ("a request needs blocks only for the tokens fed this step (its first chunk), not its whole prompt",
             lambda *case: variant(case, lambda tokens, n, block: -(-tokens // block))),
            ("n tokens fill ceil(n / block_size) blocks, not n // block_size + 1 (nor ceil((n + 1) / block_size): "
             "the token this step produces is fed, and stored, in the next step)",
             lambda *case: variant(case, lambda tokens, n, block: n // block + 1)),
            ("n tokens fill ceil(n / block_size) blocks, not n // block_size",
             lambda *case: variant(case, lambda tokens, n, block: n // block)),
            ("the blocks an admitted request takes are no longer free: subtract them",
             lambda *case: variant(case, ceil, spend=False)),
            ("at most `slots` requests join the batch", lambda *case: variant(case, ceil, use_slots=False))])

    student = lambda waiting, free, block, budget, slots: fn([tuple(w) for w in waiting], free, block,  # noqa: E731
                                                             budget, slots)
    cases = _admit_cases(seed, n_random)
    check_function(student, _admit_reference, cases, name="admit",
                   params=("waiting", "free_blocks", "block_size", "token_budget", "slots"), convert=_plan,
                   diagnose=diagnose,
                   hint="in order: n = min(tokens, budget left) tokens need ceil(n / block_size) blocks; admit while "
                        "they fit in the free blocks, a place is left and budget remains; stop at the first that "
                        "does not fit (lesson 07, section 6).")
