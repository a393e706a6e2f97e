"""The lesson 07 checkers: right answers pass with one line, typical mistakes get named."""

import pytest

from helpers.checks import lesson07 as check
from helpers.checks.core import NotAnswered
from helpers.prefix_cache import block_hash


def schedule_step(running, waiting, token_budget, max_batch):
    plan, budget = [], token_budget
    decoding = [r for r in running if r[1] == 1]  # one token to feed: their next token comes out
    prompts = [r for r in running if r[1] > 1]  # part-way through a prompt
    for name, pending in decoding + prompts:
        if budget == 0:
            break
        n = min(pending, budget)
        plan.append((name, n))
        budget -= n
    batch = len(running)  # every running request holds a place in the batch
    for name, pending in waiting:
        if budget == 0 or batch == max_batch:
            break
        n = min(pending, budget)
        plan.append((name, n))
        budget -= n
        batch += 1
    return plan


def cached_prefix(tokens, block_size, cache):
    found, key = [], None
    for start in range(0, (len(tokens) - 1) // block_size * block_size, block_size):
        key = block_hash(key, tokens[start:start + block_size])
        if key not in cache:
            break
        found.append(cache[key])
    return found

def admit(waiting, free_blocks, block_size, token_budget, slots):
    plan, budget = [], token_budget
    for name, tokens in waiting:
        if budget == 0 or len(plan) == slots:
            break
        n = min(tokens, budget)
        need = -(-n // block_size)
        if need > free_blocks:
            break
        plan.append((name, n))
        budget -= n
        free_blocks -= need
    return plan



def test_right_answers_pass_with_one_deterministic_line(capsys):
    check.schedule_step(schedule_step)
    check.cached_prefix(cached_prefix)
    check.admit(admit)
    assert capsys.readouterr().out.splitlines() == ["schedule_step: all 39 cases correct.",
                                                    "cached_prefix: all 38 cases correct.",
                                                    "admit: all 37 cases correct."]


def test_the_hidden_tests_pass_too():
    check.schedule_step(schedule_step, seed=7001, n_random=200)
    check.cached_prefix(cached_prefix, seed=7002, n_random=200)
    check.admit(admit, seed=7003, n_random=200)


def test_an_unanswered_exercise_says_so():
    def blank(*args):
        raise NotImplementedError()
    for checker in (check.schedule_step, check.cached_prefix, check.admit):
        with pytest.raises(NotAnswered, match="not answered yet"):
            checker(blank)


def waiting_first(running, waiting, token_budget, max_batch):
    return schedule_step([], waiting + running, token_budget, max_batch + len(running))


def over_budget(running, waiting, token_budget, max_batch):
    return [(name, n) for name, n in running] + [(name, n) for name, n in waiting][:max_batch - len(running)]


def running_in_order(running, waiting, token_budget, max_batch):
    plan, budget = [], token_budget
    for name, pending in running:  # the decoding ones not first
        if budget == 0:
            break
        plan.append((name, min(pending, budget)))
        budget -= plan[-1][1]
    return plan + schedule_step([], waiting, budget, max_batch - len(running)) if budget else plan


def running_not_counted(running, waiting, token_budget, max_batch):
    fed = schedule_step(running, [], token_budget, max_batch)
    left = token_budget - sum(n for _, n in fed)
    return fed + (schedule_step([], waiting, left, max_batch) if left else [])


@pytest.mark.parametrize("wrong, cause", [
    (waiting_first, "running requests come first"),
    (over_budget, "more than the budget"),
    (running_in_order, "decoding requests .1 token to feed. come first"),
    (running_not_counted, "running requests were not counted"),
])
def test_schedule_mistakes_are_named(wrong, cause):
    with pytest.raises(AssertionError, match=cause):
        check.schedule_step(wrong)


def test_a_request_with_no_budget_left_in_the_plan_is_named():
    def zero_tokens(running, waiting, token_budget, max_batch):
        plan = schedule_step(running, waiting, token_budget, max_batch)
        planned = {name for name, _ in plan}
        return plan + [(name, 0) for name, _ in running if name not in planned]
    with pytest.raises(AssertionError, match="fed 0 tokens is not in the plan"):
        check.schedule_step(zero_tokens)


def test_lookup_mistakes_are_named():
    def no_limit(tokens, block_size, cache):
        return cached_prefix(tokens + [0] * block_size, block_size, cache)  # looks at every full block
    with pytest.raises(AssertionError, match=r"\(len\(tokens\) - 1\) // block_size blocks"):
        check.cached_prefix(no_limit)

    def walk(tokens, block_size, cache, limit, chained=True, stop=True):
        found, key = [], None
        for start in range(0, max(limit, 0) * block_size, block_size):
            key = block_hash(key if chained else None, tokens[start:start + block_size])
            if key in cache:
                found.append(cache[key])
            elif stop:
                break
        return found
    mistakes = {
        "previous block's key": lambda t, b, c: walk(t, b, c, (len(t) - 1) // b, chained=False),
        "stop at the first block that is not in the cache": lambda t, b, c: walk(t, b, c, (len(t) - 1) // b, stop=False),
        "one block short": lambda t, b, c: walk(t, b, c, (len(t) - 1) // b - 1),
    }
    for cause, wrong in mistakes.items():
        with pytest.raises(AssertionError, match=cause):
            check.cached_prefix(wrong)


def test_lookup_messages_show_short_keys():
    with pytest.raises(AssertionError) as failed:
        check.cached_prefix(lambda tokens, block_size, cache: [])
    assert "…'" in str(failed.value) and len(str(failed.value).splitlines()[0]) < 400


def _admit_variant(blocks_of, stop=True, spend=True, use_slots=True):
    def wrong(waiting, free_blocks, block_size, token_budget, slots):
        plan, budget = [], token_budget
        for name, tokens in waiting:
            n = min(tokens, budget)
            if not budget or (use_slots and len(plan) == slots):
                break
            if blocks_of(tokens, n, block_size) > free_blocks:
                if stop:
                    break
                continue
            plan.append((name, n))
            budget, free_blocks = budget - n, free_blocks - blocks_of(tokens, n, block_size) * spend
        return plan
    return wrong


def ceil_blocks(tokens, n, block):
    return -(-n // block)


@pytest.mark.parametrize("wrong, cause", [
    (_admit_variant(ceil_blocks, stop=False), "first come, first served"),
    (_admit_variant(lambda tokens, n, block: -(-tokens // block)), "first chunk"),
    (_admit_variant(lambda tokens, n, block: n // block + 1), r"not n // block_size \+ 1"),
    (_admit_variant(lambda tokens, n, block: n // block), r"not n // block_size$"),
    (_admit_variant(ceil_blocks, spend=False), "no longer free"),
    (_admit_variant(ceil_blocks, use_slots=False), "at most `slots`"),
])
def test_admit_mistakes_are_named(wrong, cause):
    with pytest.raises(AssertionError) as failed:
        check.admit(wrong)
    cause_line = next(line for line in str(failed.value).splitlines() if line.startswith("Likely cause: "))
    assert __import__("re").search(cause, cause_line), cause_line


def test_one_too_many_in_the_batch_is_named_as_such():
    def off_by_one(running, waiting, token_budget, max_batch):
        plan = schedule_step(running, [], token_budget, max_batch)
        budget, batch = token_budget - sum(n for _, n in plan), len(running)
        for name, pending in waiting:
            if budget == 0 or batch > max_batch:  # should stop at == max_batch
                break
            plan.append((name, min(pending, budget)))
            budget, batch = budget - plan[-1][1], batch + 1
        return plan
    with pytest.raises(AssertionError, match="one request too many joins"):
        check.schedule_step(off_by_one)
