"""Tests for helpers.checks.lesson01: what a student sees for right, wrong and unanswered work."""

from __future__ import annotations

import pytest

from helpers.checks import lesson01

# ---- correct student solutions (written independently of helpers.kv_cache_size) ----------


def good_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element):
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def good_sequence_cache_bytes(tokens, batch, layers, kv_heads, head_dim, bytes_per_element):
    return tokens * batch * 2 * layers * kv_heads * head_dim * bytes_per_element


def good_append_step_bytes(layers, kv_heads, head_dim, bytes_per_element, batch):
    per_layer = 2 * kv_heads * head_dim * bytes_per_element * batch
    return (per_layer, per_layer * layers)


def good_crossover_tokens(weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch):
    step = 2 * layers * kv_heads * head_dim * bytes_per_element * batch
    return weight_bytes // step + 1


CHECKERS = [
    # checker, correct solution, name, number of cases with the defaults, parameters
    (lesson01.bytes_per_token, good_bytes_per_token, "bytes_per_token", 26,
     ("layers", "kv_heads", "head_dim", "bytes_per_element")),
    (lesson01.sequence_cache_bytes, good_sequence_cache_bytes, "sequence_cache_bytes", 25,
     ("tokens", "batch", "layers", "kv_heads", "head_dim", "bytes_per_element")),
    (lesson01.append_step_bytes, good_append_step_bytes, "append_step_bytes", 26,
     ("layers", "kv_heads", "head_dim", "bytes_per_element", "batch")),
    (lesson01.crossover_tokens, good_crossover_tokens, "crossover_tokens", 24,
     ("weight_bytes", "layers", "kv_heads", "head_dim", "bytes_per_element", "batch")),
]
IDS = [c[2] for c in CHECKERS]


def _message(error_info) -> str:
    return str(error_info.value)


def _line(message: str, prefix: str) -> str:
    lines = [line for line in message.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, message
    return lines[0]


# ---- success -----------------------------------------------------------------------------


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
def test_correct_solution_prints_one_deterministic_line(capsys, checker, solution, name, n, params):
    checker(solution)
    out1 = capsys.readouterr().out
    checker(solution)
    out2 = capsys.readouterr().out
    assert out1 == out2 == f"{name}: all {n} cases correct.\n"


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
def test_case_count_follows_n_random(capsys, checker, solution, name, n, params):
    checker(solution, n_random=3)
    assert capsys.readouterr().out == f"{name}: all {n - 17} cases correct.\n"


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
def test_accepts_numpy_integer_results(capsys, checker, solution, name, n, params):
    import numpy as np

    def numpy_solution(*args):
        got = solution(*args)
        return tuple(np.int64(x) for x in got) if isinstance(got, tuple) else np.int64(got)

    checker(numpy_solution)
    assert capsys.readouterr().out == f"{name}: all {n} cases correct.\n"


def test_append_accepts_a_list_pair(capsys):
    lesson01.append_step_bytes(lambda *a: list(good_append_step_bytes(*a)))
    assert capsys.readouterr().out == "append_step_bytes: all 26 cases correct.\n"


# ---- wrong answers -----------------------------------------------------------------------

SEVEN_B_CALL = "bytes_per_token(layers=32, kv_heads=32, head_dim=128, bytes_per_element=2)"


def test_bytes_per_token_missing_factor_two(capsys):
    def student(layers, kv_heads, head_dim, bytes_per_element):
        return layers * kv_heads * head_dim * bytes_per_element

    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(student)
    message = _message(info)
    assert message.startswith(f"{SEVEN_B_CALL} returned 262144, expected 524288.")
    assert _line(message, "Likely cause:") == (
        "Likely cause: the result is 2x too small: count keys and values (the factor 2), "
        "or multiply by bytes_per_element")
    assert _line(message, "Hint:").startswith("Hint: bytes per token = 2 x layers x kv_heads x head_dim")
    assert capsys.readouterr().out == ""  # no success line on failure


def test_bytes_per_token_factor_two_too_large():
    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(lambda l, k, d, b: 4 * l * k * d * b)
    assert "Likely cause: the result is 2x too large" in _message(info)


def test_bytes_per_token_missing_layers():
    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(lambda l, k, d, b: 2 * k * d * b)
    message = _message(info)
    assert f"{SEVEN_B_CALL} returned 16384, expected 524288." in message
    assert "Likely cause: the result is 32x too small: multiply by layers" in message


def test_bytes_per_token_missing_bytes_per_element_is_diagnosed():
    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(lambda l, k, d, b: 2 * l * k * d)
    assert "bytes_per_element" in _line(_message(info), "Likely cause:")


def test_bytes_per_token_float_return():
    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(lambda l, k, d, b: 2 * l * k * d * b / 1)
    message = _message(info)
    assert message.startswith(f"{SEVEN_B_CALL} returned a float (524288.0); expected an int. The value is right: "
                              "return it as an int")
    assert "use // instead of /" in message
    assert "Expected: 524288" in message
    assert "Hint:" in message


def test_bytes_per_token_non_number_return():
    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(lambda l, k, d, b: "524288")
    message = _message(info)
    assert "returned a str ('524288'); expected an int" in message
    assert "Expected: 524288" in message


def test_sequence_cache_bytes_forgets_batch():
    def student(tokens, batch, layers, kv_heads, head_dim, bytes_per_element):
        return tokens * 2 * layers * kv_heads * head_dim * bytes_per_element

    with pytest.raises(AssertionError) as info:
        lesson01.sequence_cache_bytes(student)
    message = _message(info)
    call = "sequence_cache_bytes(tokens=8192, batch=16, layers=32, kv_heads=8, head_dim=128, bytes_per_element=2)"
    assert message.startswith(f"{call} returned {8192 * 131072}, expected {16 * 8192 * 131072}.")
    assert "Likely cause: the result is 16x too small: every sequence in the batch has its own cache" in message
    assert _line(message, "Hint:").startswith("Hint: cache = tokens x batch x bytes per token")


def test_sequence_cache_bytes_float_return():
    with pytest.raises(AssertionError) as info:
        lesson01.sequence_cache_bytes(lambda *a: float(good_sequence_cache_bytes(*a)))
    message = _message(info)
    assert "returned a float" in message and "The value is right: return it as an int" in message
    assert f"Expected: {64 * 2**30}" in message


def test_append_step_bytes_wrong_order():
    with pytest.raises(AssertionError) as info:
        lesson01.append_step_bytes(lambda *a: good_append_step_bytes(*a)[::-1])
    message = _message(info)
    call = "append_step_bytes(layers=32, kv_heads=32, head_dim=128, bytes_per_element=2, batch=1)"
    assert message.startswith(f"{call} returned (524288, 16384), expected (16384, 524288).")
    assert "Likely cause: the pair is in the wrong order: (per layer, all layers)" in message
    assert "Hint:" in message


def test_append_step_bytes_single_number():
    with pytest.raises(AssertionError) as info:
        lesson01.append_step_bytes(lambda *a: good_append_step_bytes(*a)[1])
    message = _message(info)
    assert "returned 524288 (int); expected a pair (a, b) of two ints" in message
    assert "Expected: (16384, 524288)" in message


def test_append_step_bytes_float_in_pair():
    with pytest.raises(AssertionError) as info:
        lesson01.append_step_bytes(lambda *a: tuple(float(x) for x in good_append_step_bytes(*a)))
    message = _message(info)
    assert "returned a pair holding a float (16384.0); expected an int. The value is right" in message


def test_append_step_bytes_forgets_batch():
    def student(layers, kv_heads, head_dim, bytes_per_element, batch):
        per_layer = 2 * kv_heads * head_dim * bytes_per_element
        return per_layer, per_layer * layers

    with pytest.raises(AssertionError) as info:
        lesson01.append_step_bytes(student)
    message = _message(info)
    assert message.startswith("append_step_bytes(layers=32, kv_heads=1, head_dim=64, bytes_per_element=2, batch=8) "
                              "returned (256, 8192), expected (2048, 65536).")
    assert "Hint:" in message


def test_crossover_off_by_one_floor_only():
    def student(weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch):
        return weight_bytes // (2 * layers * kv_heads * head_dim * bytes_per_element * batch)

    with pytest.raises(AssertionError) as info:
        lesson01.crossover_tokens(student)
    message = _message(info)
    call = ("crossover_tokens(weight_bytes=13476831232, layers=32, kv_heads=32, head_dim=128, "
            "bytes_per_element=2, batch=1)")
    assert message.startswith(f"{call} returned 25705, expected 25706.")
    assert "Likely cause: at that count the cache is not yet larger than the weights" in message
    assert _line(message, "Hint:").startswith("Hint: find the smallest whole n")


def test_crossover_off_by_one_ceiling_fails_on_exact_multiple():
    # Ceiling division is right except when the weights are an exact multiple of a step.
    def student(weight_bytes, layers, kv_heads, head_dim, bytes_per_element, batch):
        step = 2 * layers * kv_heads * head_dim * bytes_per_element * batch
        return -(-weight_bytes // step)

    with pytest.raises(AssertionError) as info:
        lesson01.crossover_tokens(student)
    message = _message(info)
    assert message.startswith("crossover_tokens(weight_bytes=524288000, layers=32, kv_heads=32, head_dim=128, "
                              "bytes_per_element=2, batch=1) returned 1000, expected 1001.")
    assert "Likely cause: at that count the cache is not yet larger" in message


def test_crossover_float_return():
    with pytest.raises(AssertionError) as info:
        lesson01.crossover_tokens(lambda *a: float(good_crossover_tokens(*a)))
    assert "returned a float (25706.0); expected an int. The value is right" in _message(info)


# ---- unanswered, not a function, wrong signature, crashing -------------------------------


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
def test_unanswered_exercise(checker, solution, name, n, params):
    def student(*args):
        # YOUR CODE HERE
        raise NotImplementedError()

    with pytest.raises(NotImplementedError, match="not answered yet") as info:
        checker(student)
    message = _message(info)
    assert message.startswith(f"{name} is not answered yet")
    assert "raise NotImplementedError()" in message and "student()" in message  # names the unanswered function
    assert info.value.__suppress_context__  # no chained traceback from the student's cell


@pytest.mark.parametrize("value", [None, 524288, "bytes_per_token"])
@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
def test_not_a_function(checker, solution, name, n, params, value):
    with pytest.raises(AssertionError, match="should be a function") as info:
        checker(value)
    message = _message(info)
    assert message.startswith(f"{name} should be a function, but it is {type(value).__name__} ({value!r}).")


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
@pytest.mark.parametrize("delta", [-1, +1])
def test_wrong_number_of_parameters(checker, solution, name, n, params, delta):
    count = len(params) + delta
    names = ", ".join(f"a{i}" for i in range(count))
    namespace = {}
    exec(f"def student({names}):\n    return 0\n", namespace)

    with pytest.raises(AssertionError) as info:
        checker(namespace["student"])
    message = _message(info)
    assert message.startswith(f"{name} must accept ({', '.join(params)})")
    assert info.value.__cause__ is None


@pytest.mark.parametrize("checker, solution, name, n, params", CHECKERS, ids=IDS)
@pytest.mark.parametrize("error", [ZeroDivisionError("division by zero"), TypeError("bad operand"),
                                   KeyError("heads")])
def test_student_exception_is_named(checker, solution, name, n, params, error):
    def student(*args):
        raise error

    with pytest.raises(AssertionError) as info:
        checker(student)
    message = _message(info)
    first_line = message.splitlines()[0]
    assert first_line.startswith(f"{name}(")
    assert f" raised {type(error).__name__}: {error}" in first_line
    assert "Hint:" in message
    assert info.value.__suppress_context__


def test_student_exception_on_a_later_case_names_that_case():
    def student(layers, kv_heads, head_dim, bytes_per_element):
        if kv_heads == 1:
            raise ZeroDivisionError("oops")
        return 2 * layers * kv_heads * head_dim * bytes_per_element

    with pytest.raises(AssertionError) as info:
        lesson01.bytes_per_token(student)
    assert _message(info).startswith(
        "bytes_per_token(layers=32, kv_heads=1, head_dim=64, bytes_per_element=2) raised ZeroDivisionError: oops")


# ---- tamper resistance -----------------------------------------------------------------
def test_object_that_equals_everything_does_not_pass():
    class Cheat(int):
        def __eq__(self, other):
            return True

        def __ne__(self, other):
            return False

        __hash__ = int.__hash__

    with pytest.raises(AssertionError, match="returned 0, expected 524288"):
        lesson01.bytes_per_token(lambda *args: Cheat(0))


def test_patching_the_reference_while_checked_does_not_pass(monkeypatch):
    import helpers.kv_cache_size as ref

    def student(tokens, batch, layers, kv_heads, head_dim, bytes_per_element):
        # Make the reference agree with a wrong answer, then give the wrong answer.
        monkeypatch.setattr(ref, "cache_bytes", lambda *args: 0)
        monkeypatch.setattr(ref, "kv_bytes_per_token", lambda *args: 0)
        return 0

    with pytest.raises(AssertionError, match="returned 0, expected 68719476736"):
        lesson01.sequence_cache_bytes(student)


def test_a_wrong_float_gets_no_advice_to_make_it_an_int():
    with pytest.raises(AssertionError) as info:
        lesson01.sequence_cache_bytes(lambda tokens, batch, layers, kv_heads, head_dim, bpe:
                                   tokens * batch * 2 * layers * kv_heads * head_dim * bpe / 1024**3)  # GiB
    message = _message(info)
    assert "returned a float (64.0); expected an int" in message and "The value is right" not in message


@pytest.mark.parametrize("wrong, cause", [
    (lambda layers, kv_heads, head_dim, bpe, batch: (kv_heads * head_dim * bpe * batch,
                                                    layers * kv_heads * head_dim * bpe * batch), "the factor 2"),
    (lambda layers, kv_heads, head_dim, bpe, batch: (2 * kv_heads * head_dim * bpe,
                                                    2 * layers * kv_heads * head_dim * bpe), "multiply by batch"),
])
def test_append_step_bytes_names_a_missing_factor(wrong, cause):
    with pytest.raises(AssertionError, match=f"Likely cause: .*{cause}"):
        lesson01.append_step_bytes(wrong)
