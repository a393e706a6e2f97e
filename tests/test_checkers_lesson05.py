"""The lesson 05 checkers: right answers pass with one line, typical mistakes get named."""

import pytest

from helpers.checks import lesson05 as check


def good_blocks_for(tokens, block_size):
    return -(-tokens // block_size)


def good_waste(lengths, block_size, reserve):
    tokens = sum(lengths)
    paged = sum(good_blocks_for(n, block_size) * block_size for n in lengths)
    return 1 - tokens / (reserve * len(lengths)), 1 - tokens / paged


def good_drop_tokens(table, length, free, count, block_size):
    if not 0 <= count <= length:
        raise ValueError("count out of range")
    keep = -(-(length - count) // block_size)
    return table[:keep], length - count, free + table[keep:][::-1]


def good_decode_ceiling(bandwidth, weight_bytes, cache_bytes_per_token, context, batch):
    return batch * bandwidth / (weight_bytes + batch * context * cache_bytes_per_token)


def test_right_answers_pass_with_one_deterministic_line(capsys):
    for _ in range(2):
        check.blocks_for(good_blocks_for)
        check.waste(good_waste)
        check.drop_tokens(good_drop_tokens)
        check.decode_ceiling(good_decode_ceiling)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["blocks_for: all 26 cases correct.", "waste: all 24 cases correct.",
                         "drop_tokens: all 26 cases correct.", "decode_ceiling: all 24 cases correct."]
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
    with pytest.raises(AssertionError, match="The value is right: return it as an int"):
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


def test_decode_ceiling_forgets_the_batch():
    with pytest.raises(AssertionError) as info:
        check.decode_ceiling(lambda bw, w, c, n, b: bw / (w + b * n * c))
    message = str(info.value)
    assert message.startswith("decode_ceiling(bandwidth=3350000000000.0, weight_bytes=16060522496, "
                              "cache_bytes_per_token=131072, context=4096, batch=64) returned")
    assert "Likely cause: each step produces one token for every sequence of the batch: multiply by batch" in message


def test_decode_ceiling_reads_weights_once_per_sequence():
    with pytest.raises(AssertionError, match="Likely cause: that is one sequence's rate: either the batch is left out "
                                             "everywhere, or the weights are counted once per sequence"):
        check.decode_ceiling(lambda bw, w, c, n, b: b * bw / (b * (w + n * c)))


def test_decode_ceiling_other_mistake_has_no_likely_cause():
    with pytest.raises(AssertionError) as info:
        check.decode_ceiling(lambda bw, w, c, n, b: b * bw / (w + b * n * c * 2))
    assert "Likely cause" not in str(info.value) and "Hint: bytes per step" in str(info.value)


@pytest.mark.parametrize("checker, name", [(check.blocks_for, "blocks_for"), (check.waste, "waste"),
                                           (check.drop_tokens, "drop_tokens"),
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


def test_drop_tokens_with_floor_division_is_named(capsys):
    def floor(table, length, free, count, block_size):
        keep = (length - count) // block_size
        return table[:keep], length - count, free + table[keep:][::-1]

    with pytest.raises(AssertionError) as info:
        check.drop_tokens(floor)
    message = str(info.value)
    assert message.startswith("drop_tokens(table=[7, 3], length=6, free=[5], count=3, block_size=4) returned table [], "
                              "expected [7].")
    assert "floor division drops the last, partly filled block" in message
    assert capsys.readouterr().out == ""


def test_drop_tokens_releasing_in_table_order_is_named():
    def in_order(table, length, free, count, block_size):
        keep = -(-(length - count) // block_size)
        if not 0 <= count <= length:
            raise ValueError
        return table[:keep], length - count, free + table[keep:]

    with pytest.raises(AssertionError, match=r"drop_tokens\(table=\[7, 3, 9\], length=9, free=\[\], count=5, "
                                             r"block_size=4\) returned free list \[3, 9\], expected \[9, 3\]\."
                                             r"(.|\n)*last block first"):
        check.drop_tokens(in_order)


def test_drop_tokens_adding_the_count_is_named():
    def grows(table, length, free, count, block_size):
        table, _, free = good_drop_tokens(table, length, free, count, block_size)
        return table, length + count, free

    with pytest.raises(AssertionError, match="the length goes down by count"):
        check.drop_tokens(grows)


@pytest.mark.parametrize("bad, why", [(lambda c, n: c > n, "holds only 6 tokens"),
                                      (lambda c, n: c < 0, "a count below 0")])
def test_drop_tokens_must_refuse_an_impossible_count(bad, why):
    def lets_through(table, length, free, count, block_size):
        if bad(count, length):
            return list(table), length, list(free)
        return good_drop_tokens(table, length, free, count, block_size)

    with pytest.raises(AssertionError, match=why + ".*raise ValueError instead"):
        check.drop_tokens(lets_through)


def test_drop_tokens_raising_something_else_is_named():
    def index_error(table, length, free, count, block_size):
        if count > length:
            raise IndexError("too many")
        return good_drop_tokens(table, length, free, count, block_size)

    with pytest.raises(AssertionError, match=r"count=7, block_size=4\) raised IndexError; the sequence holds only 6 "
                                             r"tokens: raise ValueError"):
        check.drop_tokens(index_error)


def test_drop_tokens_that_changes_or_returns_the_given_lists_is_named():
    def in_place(table, length, free, count, block_size):
        table_out, new_length, free_out = good_drop_tokens(table, length, free, count, block_size)
        free.extend(free_out[len(free):])
        del table[len(table_out):]
        return table, new_length, free

    with pytest.raises(AssertionError, match=r"changed the lists it was given \(table became \[7\], free became \[5, 3\]\)"):
        check.drop_tokens(in_place)

    def same_objects(table, length, free, count, block_size):
        table_out, new_length, free_out = good_drop_tokens(table, length, free, count, block_size)
        return (table if table_out == table else table_out), new_length, (free if free_out == free else free_out)

    with pytest.raises(AssertionError, match="returned a list it was given, not a new one"):
        check.drop_tokens(same_objects)


def test_drop_tokens_with_count_zero_gets_no_wrong_cause():
    def empties(table, length, free, count, block_size):
        if not 0 <= count <= length:
            raise ValueError
        if count == 0:
            return [], length, list(free)  # table[:-0] is empty
        return good_drop_tokens(table, length, free, count, block_size)

    with pytest.raises(AssertionError) as info:
        check.drop_tokens(empties)
    assert "count=0" in str(info.value) and "the length goes down by count" not in str(info.value)


def test_drop_tokens_returning_the_given_lists_when_nothing_is_dropped_is_named():
    def same_when_zero(table, length, free, count, block_size):
        if count == 0:
            return table, length, free
        return good_drop_tokens(table, length, free, count, block_size)

    with pytest.raises(AssertionError, match=r"count=0, block_size=4\) returned a list it was given"):
        check.drop_tokens(same_when_zero)
