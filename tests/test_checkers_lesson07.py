"""The lesson 07 checkers: right answers pass with one line, typical mistakes get named."""

import pytest

from helpers.checks import lesson07 as check
from helpers.checks.core import NotAnswered
from helpers.prefix_cache import block_hash


def schedule_step(running, waiting, token_budget, max_batch):
    plan, budget = [], token_budget
    for name, pending in running:
        if budget == 0:
            break
        n = min(pending, budget)
        plan.append((name, n))
        budget -= n
    batch = len(running)
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
    assert capsys.readouterr().out.splitlines() == ["schedule_step: all 37 cases correct.",
                                                    "cached_prefix: all 37 cases correct.",
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


def skipped_running_not_counted(running, waiting, token_budget, max_batch):
    fed = schedule_step(running, [], token_budget, max_batch)
    return fed + schedule_step([], waiting, token_budget - sum(n for _, n in fed), max_batch - len(fed))[:]


@pytest.mark.parametrize("wrong, cause", [
    (waiting_first, "running requests come first"),
    (over_budget, "more than the budget"),
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
    with pytest.raises(AssertionError, match=r"\(len\(tokens\) - 1\) // block_size"):
        check.cached_prefix(no_limit)

    def unchained(tokens, block_size, cache):
        found = []
        for start in range(0, (len(tokens) - 1) // block_size * block_size, block_size):
            key = block_hash(None, tokens[start:start + block_size])
            if key not in cache:
                break
            found.append(cache[key])
        return found
    with pytest.raises(AssertionError, match="previous block's key"):
        check.cached_prefix(unchained)


def test_admit_mistakes_are_named():
    def overtakes(waiting, free_blocks, block_size, token_budget, slots):
        plan, budget = [], token_budget
        for name, tokens in waiting:
            n = min(tokens, budget)
            need = -(-n // block_size)
            if budget and len(plan) < slots and need <= free_blocks:
                plan.append((name, n))
                budget, free_blocks = budget - n, free_blocks - need
        return plan
    with pytest.raises(AssertionError, match="first come, first served"):
        check.admit(overtakes)

    def whole_prompt(waiting, free_blocks, block_size, token_budget, slots):
        plan, budget = [], token_budget
        for name, tokens in waiting:
            need = -(-tokens // block_size)  # blocks for the whole prompt, not the chunk fed now
            if not budget or len(plan) == slots or need > free_blocks:
                break
            plan.append((name, min(tokens, budget)))
            budget, free_blocks = budget - min(tokens, budget), free_blocks - need
        return plan
    with pytest.raises(AssertionError, match="first chunk"):
        check.admit(whole_prompt)

    def floor_blocks(waiting, free_blocks, block_size, token_budget, slots):
        plan, budget = [], token_budget
        for name, tokens in waiting:
            n = min(tokens, budget)
            if not budget or len(plan) == slots or n // block_size + 1 > free_blocks:
                break
            plan.append((name, n))
            budget, free_blocks = budget - n, free_blocks - (n // block_size + 1)
        return plan
    with pytest.raises(AssertionError, match=r"ceil\(n / block_size\)"):
        check.admit(floor_blocks)
