"""The lesson 05 checkers: right answers pass with one line, typical mistakes get named."""

import pytest

from helpers.checks import lesson05 as check


def good_blocks_for(tokens, block_size):
    return -(-tokens // block_size)


def good_waste(lengths, block_size, reserve):
    tokens = sum(lengths)
    paged = sum(good_blocks_for(n, block_size) * block_size for n in lengths)
    return 1 - tokens / (reserve * len(lengths)), 1 - tokens / paged


def good_append_token(table, length, free, block_size):
    if length % block_size == 0:
        if not free:
            raise MemoryError("no free block")
        return table + [free[-1]], length + 1, free[:-1]
    return list(table), length + 1, list(free)


def good_decode_ceiling(bandwidth, weight_bytes, cache_bytes_per_token, context, batch):
    return batch * bandwidth / (weight_bytes + batch * context * cache_bytes_per_token)


def test_right_answers_pass_with_one_deterministic_line(capsys):
    for _ in range(2):
        check.blocks_for(good_blocks_for)
        check.waste(good_waste)
        check.append_token(good_append_token)
        check.decode_ceiling(good_decode_ceiling)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["blocks_for: all 26 cases correct.", "waste: all 24 cases correct.",
                         "append_token: all 25 cases correct.", "decode_ceiling: all 24 cases correct."]
    assert lines[4:] == lines[:4]


def test_other_correct_forms_pass(capsys):
    import math

    check.blocks_for(lambda tokens, block: math.ceil(tokens / block))
    check.waste(lambda lengths, b, r: [1 - sum(lengths) / (r * len(lengths)),
                                       1 - sum(lengths) / sum(-(-n // b) * b for n in lengths)])
    check.decode_ceiling(lambda bw, w, c, n, b: bw / (w / b + n * c))  # same value, other order
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_blocks_for_floor_division(capsys):
    with pytest.raises(AssertionError) as info:
        check.blocks_for(lambda tokens, block: tokens // block)
    message = str(info.value)
    assert message.startswith("blocks_for(tokens=1, block_size=16) returned 0, expected 1.")
    assert "Likely cause: floor division drops the last, partly filled block: round up" in message
    assert "Hint:" in message
    assert capsys.readouterr().out == ""


def test_blocks_for_one_too_many():
    with pytest.raises(AssertionError, match=r"blocks_for\(tokens=16, block_size=16\) returned 2, expected 1") as info:
        check.blocks_for(lambda tokens, block: tokens // block + 1)
    assert "Likely cause" not in str(info.value)


def test_blocks_for_float_answer():
    with pytest.raises(AssertionError, match="return an int"):
        check.blocks_for(lambda tokens, block: float(-(-tokens // block)))


def test_waste_used_share_instead_of_waste(capsys):
    def used_share(lengths, block_size, reserve):
        contiguous, paged = good_waste(lengths, block_size, reserve)
        return 1 - contiguous, 1 - paged

    with pytest.raises(AssertionError, match="Likely cause: that is the share that holds tokens; waste is 1 minus it"):
        check.waste(used_share)
    assert capsys.readouterr().out == ""


def test_waste_paged_without_rounding_up():
    with pytest.raises(AssertionError, match=r"waste\(lengths=\[100, 2000, 37\], block_size=16, reserve=2048\) returned"):
        check.waste(lambda lengths, b, r: (good_waste(lengths, b, r)[0], 0.0))


def test_waste_not_a_pair():
    with pytest.raises(AssertionError, match=r"expected a tuple of 2 fractions \(contiguous, paged\)"):
        check.waste(lambda lengths, b, r: good_waste(lengths, b, r)[0])


def test_append_token_takes_the_first_free_block(capsys):
    def first_free(table, length, free, block_size):
        if length % block_size == 0:
            if not free:
                raise MemoryError
            table.append(free.pop(0))
        return table, length + 1, free

    with pytest.raises(AssertionError) as info:
        check.append_token(first_free)
    message = str(info.value)
    assert message.startswith("append_token(table=[], length=0, free=[3, 2, 1], block_size=4) "
                              "returned table [3], expected [1].")
    assert "take the last block of the free list" in message
    assert capsys.readouterr().out == ""


def test_append_token_forgets_the_empty_table():
    def skips_first(table, length, free, block_size):
        if length > 0 and length % block_size == 0:
            table.append(free.pop())
        return table, length + 1, free

    with pytest.raises(AssertionError, match=r"returned table \[\], expected \[1\]"):
        check.append_token(skips_first)


def test_append_token_forgets_the_length():
    def same_length(table, length, free, block_size):
        table, _, free = good_append_token(table, length, free, block_size)
        return table, length, free

    with pytest.raises(AssertionError, match="returned length 0, expected 1"):
        check.append_token(same_length)


def test_append_token_pops_an_empty_free_list(capsys):
    def unguarded(table, length, free, block_size):
        if length % block_size == 0:
            table.append(free.pop())
        return table, length + 1, free

    with pytest.raises(AssertionError) as info:
        check.append_token(unguarded)  # right on every ordinary case
    message = str(info.value)
    assert "raised IndexError; with no free block it should raise MemoryError" in message
    assert capsys.readouterr().out == ""  # no success line when the last check fails


def test_append_token_returns_when_no_block_is_free(capsys):
    def no_block_no_error(table, length, free, block_size):
        if length % block_size == 0 and free:
            table.append(free.pop())
        return table, length + 1, free

    with pytest.raises(AssertionError) as info:
        check.append_token(no_block_no_error)
    message = str(info.value)
    assert "needs a new block and none is free: raise MemoryError instead of returning" in message
    assert capsys.readouterr().out == ""


def test_append_token_raising_something_else_when_full():
    def value_error(table, length, free, block_size):
        if length % block_size == 0 and not free:
            raise ValueError("full")
        return good_append_token(table, length, free, block_size)

    with pytest.raises(AssertionError, match="raised ValueError; with no free block it should raise MemoryError"):
        check.append_token(value_error)


def test_decode_ceiling_forgets_the_batch():
    with pytest.raises(AssertionError) as info:
        check.decode_ceiling(lambda bw, w, c, n, b: bw / (w + b * n * c))
    message = str(info.value)
    assert message.startswith("decode_ceiling(bandwidth=3350000000000.0, weight_bytes=16060522496, "
                              "cache_bytes_per_token=131072, context=4096, batch=64) returned")
    assert "Likely cause: each step produces one token for every sequence of the batch: multiply by batch" in message


def test_decode_ceiling_reads_weights_once_per_sequence():
    with pytest.raises(AssertionError, match="Likely cause: the weights are read once per step for the whole batch, "
                                             "not once per sequence"):
        check.decode_ceiling(lambda bw, w, c, n, b: b * bw / (b * (w + n * c)))


def test_decode_ceiling_other_mistake_has_no_likely_cause():
    with pytest.raises(AssertionError) as info:
        check.decode_ceiling(lambda bw, w, c, n, b: b * bw / (w + b * n * c * 2))
    assert "Likely cause" not in str(info.value) and "Hint: bytes per step" in str(info.value)


@pytest.mark.parametrize("checker, name", [(check.blocks_for, "blocks_for"), (check.waste, "waste"),
                                           (check.append_token, "append_token"),
                                           (check.decode_ceiling, "decode_ceiling")])
def test_unanswered_exercises(checker, name, capsys):
    def blank(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError, match=f"{name} is not answered yet") as info:
        checker(blank)
    assert "not answered yet" in str(info.value) and "blank()" in str(info.value)
    assert capsys.readouterr().out == ""


def test_not_a_function():
    with pytest.raises(AssertionError, match="blocks_for should be a function"):
        check.blocks_for(16)


def test_append_that_changes_or_returns_the_given_lists_is_named():
    def in_place(table, length, free, block_size):
        if length % block_size == 0:
            if not free:
                raise MemoryError()
            table.append(free.pop())
        return table, length + 1, free

    with pytest.raises(AssertionError, match=r"changed the lists it was given \(table became \[7, 9\], free became \[5\]\)"):
        check.append_token(in_place)

    def same_objects(table, length, free, block_size):
        if length % block_size == 0:
            if not free:
                raise MemoryError()
            return table + [free[-1]], length + 1, free[:-1]
        return table, length + 1, free

    with pytest.raises(AssertionError, match="returned a list it was given, not a new one"):
        check.append_token(same_objects)
