"""The lesson 02 checkers: right answers pass with one line, typical mistakes get named."""

import numpy as np
import pytest

from helpers.checks import lesson02 as check


def good_gqa(tokens, layers, q_heads, kv_heads, head_dim, bytes_per_element):
    return tokens * 2 * layers * (q_heads - kv_heads) * head_dim * bytes_per_element


def good_mla(layers, kv_lora_rank, qk_rope_head_dim):
    return layers * (kv_lora_rank + qk_rope_head_dim)


def good_quantize(x):
    amax = np.abs(x).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / 127, 1.0)
    return np.clip(np.rint(x / scale), -127, 127).astype(np.int8), scale


def good_dequantize(q, scale):
    return q.astype(np.float32) * scale


def good_fit(budget, weights, layers, kv_heads, head_dim, bpe, batch):
    return max(0, (budget - weights) // (batch * 2 * layers * kv_heads * head_dim * bpe))


def test_right_answers_pass_with_one_deterministic_line(capsys):
    for _ in range(2):
        check.gqa_bytes_saved(good_gqa)
        check.mla_elements_per_token(good_mla)
        check.quantize_int8_per_channel(good_quantize, good_dequantize)
        check.longest_context(good_fit)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == ["gqa_bytes_saved: all 26 cases correct.", "mla_elements_per_token: all 24 cases correct.",
                         "dequantize_int8: all 23 cases correct.", "quantize_int8_per_channel: all 23 cases correct.",
                         "longest_context: all 25 cases correct."]
    assert lines[5:] == lines[:5]


def test_gqa_missing_factor_two():
    with pytest.raises(AssertionError) as info:
        check.gqa_bytes_saved(lambda t, L, q, k, d, b: t * L * (q - k) * d * b)
    message = str(info.value)
    assert message.startswith("gqa_bytes_saved(tokens=8192, layers=32, q_heads=32, kv_heads=8, head_dim=128, "
                              "bytes_per_element=2) returned 1610612736, expected 3221225472.")
    assert "Likely cause: half the saving: either the factor 2" in message and "Hint:" in message


def test_gqa_missing_bytes_per_element_is_not_blamed_on_the_factor_two():
    with pytest.raises(AssertionError, match=r"or bytes_per_element \(= 2 here\) is missing"):
        check.gqa_bytes_saved(lambda t, L, q, k, d, b: 2 * t * L * (q - k) * d)


def test_gqa_reversed_sign():
    with pytest.raises(AssertionError, match="the sign is reversed"):
        check.gqa_bytes_saved(lambda *a: -good_gqa(*a))


@pytest.mark.parametrize("student, cause", [
    (lambda L, r, p: 2 * L * (r + p), "no factor 2"),
    (lambda L, r, p: L * r, "the rotary key"),
    (lambda L, r, p: r + p, "multiply by layers"),
])
def test_mla_mistakes_are_named(student, cause):
    with pytest.raises(AssertionError, match=cause):
        check.mla_elements_per_token(student)


def test_int8_float_codes():
    with pytest.raises(AssertionError, match="returned q of dtype float32, expected int8"):
        check.quantize_int8_per_channel(lambda x: (np.rint(x / (np.abs(x).max(0) / 127)), np.abs(x).max(0) / 127),
                               good_dequantize)


def test_int8_one_scale_for_the_whole_tensor():
    def per_tensor(x):
        scale = np.abs(x).max() / 127
        return np.rint(x / scale).astype(np.int8), scale

    with pytest.raises(AssertionError, match=r"returned 1 scales, expected 2 \(one per channel"):
        check.quantize_int8_per_channel(per_tensor, good_dequantize)


def test_int8_scale_per_token_instead_of_per_channel():
    def per_token(x):
        scale = np.abs(x).max(axis=1, keepdims=True) / 127
        return np.rint(x / scale).astype(np.int8), scale

    with pytest.raises(AssertionError, match="returned 3 scales, expected 2"):
        check.quantize_int8_per_channel(per_token, good_dequantize)


def test_int8_zero_channel_divides_by_zero():
    def no_guard(x):
        scale = np.abs(x).max(axis=0, keepdims=True) / 127
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.nan_to_num(np.rint(x / scale)).astype(np.int8), scale

    with pytest.raises(AssertionError, match=r"which is not a positive finite number \(that channel is all zeros: use 1.0\)"):
        check.quantize_int8_per_channel(no_guard, good_dequantize)


def test_dequantize_errors_and_unanswered():
    with pytest.raises(AssertionError, match=r"returned 2 at index \(0, 0\), expected 1"):
        check.quantize_int8_per_channel(good_quantize, lambda q, s: q * s.astype(np.float32) + 1)

    def blank(q, scale):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError, match="dequantize_int8 is not answered yet"):
        check.quantize_int8_per_channel(good_quantize, blank)


def test_longest_context_mistakes():
    with pytest.raises(AssertionError, match="nothing fits: return 0"):
        check.longest_context(lambda B, W, L, k, d, b, n: (B - W) // (n * 2 * L * k * d * b))
    with pytest.raises(AssertionError, match="one token too many"):
        check.longest_context(lambda *a: good_fit(*a) + 1)


@pytest.mark.parametrize("rounding, named", [
    (np.trunc, r"truncated toward zero.*round first"),
    (np.floor, r"holding -128: a value was rounded down past -127 \(np\.floor"),
])
def test_int8_wrong_rounding_is_named(rounding, named):
    def wrong(x):
        q, scale = good_quantize(x)
        return rounding(x / scale).astype(np.int8), scale

    with pytest.raises(AssertionError, match=named):
        check.quantize_int8_per_channel(wrong, good_dequantize)


def test_int8_swapped_pair_is_named():
    with pytest.raises(AssertionError, match=r"order looks swapped; return \(q, scale\)"):
        check.quantize_int8_per_channel(lambda x: good_quantize(x)[::-1], good_dequantize)


def test_longest_context_for_one_sequence_is_named():
    def one_sequence(budget, weights, layers, kv_heads, head_dim, bpe, batch):
        return max(0, (budget - weights) // (2 * layers * kv_heads * head_dim * bpe))

    with pytest.raises(AssertionError, match="Likely cause: that is the length for one sequence"):
        check.longest_context(one_sequence)
