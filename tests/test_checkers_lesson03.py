"""The lesson 03 checkers: right answers pass with one line, typical mistakes get named."""

import math

import numpy as np
import pytest

from helpers.checks import lesson03 as check
from helpers.flash import flash_attention, flash_blocks, flash_traffic, naive_attention, standard_traffic


def good_update(m, l, scores):
    m_new = max(m, float(np.max(scores)))
    return m_new, (l * math.exp(m - m_new) if math.isfinite(m) else 0.0) + float(np.exp(scores - m_new).sum())


def good_merge(m_a, l_a, o_a, m_b, l_b, o_b):
    m = max(m_a, m_b)
    w_a, w_b = l_a * math.exp(m_a - m), l_b * math.exp(m_b - m)
    return m, w_a + w_b, (w_a * o_a + w_b * o_b) / (w_a + w_b)


def good_tiled(q, k, v, block_q, block_k, causal):
    return flash_attention(q, k, v, block_q, block_k, causal)[0]


def good_traffic(n, d, sram):
    return standard_traffic(n, d), flash_traffic(n, d, *flash_blocks(sram, d))


def test_right_answers_pass_with_one_deterministic_line(capsys):
    for _ in range(2):
        check.online_update(good_update)
        check.merge_states(good_merge)
        check.tiled_attention(good_tiled)
        check.hbm_traffic(good_traffic)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["online_update: all 24 cases correct.", "merge_states: all 23 cases correct.",
                         "tiled_attention: all 26 cases correct.", "hbm_traffic: all 25 cases correct."]
    assert lines[4:] == lines[:4]


def test_update_without_rescale():
    def forgot(m, l, scores):
        m_new = max(m, float(np.max(scores)))
        return m_new, l + float(np.exp(scores - m_new).sum())

    with pytest.raises(AssertionError) as info:
        check.online_update(forgot)
    message = str(info.value)
    assert message.startswith("online_update(m=0.0, l=1.0, scores=np.array([5.], dtype=float64)) returned")
    assert "multiply it by exp(m - m_new)" in message and "Hint:" in message


def test_update_that_overflows():
    def unsafe(m, l, scores):  # sums exp(s) without shifting, then divides
        with np.errstate(over="ignore", invalid="ignore"):
            m_new = max(m, float(np.max(scores)))
            total = (l * np.exp(m) if math.isfinite(m) else 0.0) + np.exp(scores).sum()
            return m_new, float(total / np.exp(m_new))

    with pytest.raises(AssertionError, match="Likely cause: exp overflowed"):
        check.online_update(unsafe)
    def unshifted(m, l, scores):  # right for small scores, overflows math.exp for large ones
        m_new = max(m, float(np.max(scores)))
        total = (l * math.exp(m) if math.isfinite(m) else 0.0) + sum(math.exp(x) for x in scores)
        return m_new, total / math.exp(m_new)

    with pytest.raises(AssertionError, match=r"online_update\(m=1000.0, .*raised OverflowError"):
        check.online_update(unshifted)


def test_merge_with_equal_weights():
    with pytest.raises(AssertionError, match="averaged equally"):
        check.merge_states(lambda m_a, l_a, o_a, m_b, l_b, o_b: (max(m_a, m_b), l_a + l_b, (o_a + o_b) / 2))


def test_tiled_without_causal_offset():
    def top_left(q, k, v, block_q, block_k, causal):
        if causal:  # the wrong alignment: query i sees keys 0..i
            n_q, n_k = len(q), len(k)
            mask = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]
            s = np.where(mask, q @ k.T / math.sqrt(q.shape[1]), -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            return (p / p.sum(axis=1, keepdims=True)) @ v
        return good_tiled(q, k, v, block_q, block_k, causal)

    with pytest.raises(AssertionError, match=r"tiled_attention\(q=.*causal=True\) returned .* expected"):
        check.tiled_attention(top_left)


def test_tiled_that_builds_the_table_fails_on_memory():
    with pytest.raises(AssertionError, match=r"allocated .* MiB at its peak; the whole 1024 x 1024 score table is 8 MiB"):
        check.tiled_attention(lambda q, k, v, bq, bk, causal: naive_attention(q, k, v, causal))


def test_tiled_wrong_shape_and_nan():
    with pytest.raises(AssertionError, match=r"returned shape \(8,\), expected \(8, 4\)"):
        check.tiled_attention(lambda q, k, v, bq, bk, causal: good_tiled(q, k, v, bq, bk, causal).sum(axis=1))
    with pytest.raises(AssertionError, match="returned NaN or inf"):
        check.tiled_attention(lambda q, k, v, bq, bk, causal: good_tiled(q, k, v, bq, bk, causal) * np.nan)


def test_traffic_mistakes_are_named():
    with pytest.raises(AssertionError, match="count the first write of O, l and m"):
        check.hbm_traffic(lambda n, d, m: (standard_traffic(n, d), good_traffic(n, d, m)[1] - n * (d + 2)))
    with pytest.raises(AssertionError, match="standard attention: read Q, K; write S"):
        check.hbm_traffic(lambda n, d, m: (2 * n * d + 2 * n * n, good_traffic(n, d, m)[1]))


def test_traffic_with_floor_passes_is_named():
    def floored(n, d, m):
        b_r, b_c = flash_blocks(m, d)
        return standard_traffic(n, d), n * (d + 2) + 2 * n * d + (n // b_c) * n * (3 * d + 4)

    with pytest.raises(AssertionError, match=r"ceil\(n / B_c\) = \d+: a last, partly filled block"):
        check.hbm_traffic(floored)


def test_unanswered_exercise_says_so():
    def blank(*args):
        raise NotImplementedError()

    for checker in (check.online_update, check.merge_states, check.tiled_attention, check.hbm_traffic):
        with pytest.raises(NotImplementedError, match="not answered yet"):
            checker(blank)


def test_merge_returning_the_log_sum_exp_is_named_not_equal_weights():
    def lse_form(m_a, l_a, o_a, m_b, l_b, o_b):
        m, l, o = good_merge(m_a, l_a, o_a, m_b, l_b, o_b)
        return m + math.log(l), 1.0, o

    with pytest.raises(AssertionError) as info:
        check.merge_states(lse_form)
    message = str(info.value)
    assert "m came back as the log-sum-exp" in message and "averaged equally" not in message


def test_tiled_without_the_sqrt_d_scale_is_named():
    def unscaled(q, k, v, block_q, block_k, causal):
        return flash_attention(q * math.sqrt(q.shape[1]), k, v, block_q, block_k, causal)[0]

    with pytest.raises(AssertionError, match=r"not divided by sqrt\(d\)"):
        check.tiled_attention(unscaled)


def test_tiled_that_builds_the_whole_mask_when_causal_fails_on_memory():
    def whole_mask(q, k, v, block_q, block_k, causal):
        if causal:
            np.tril(np.ones((q.shape[0], k.shape[0])), k.shape[0] - q.shape[0]).astype(bool)
        return good_tiled(q, k, v, block_q, block_k, causal)

    with pytest.raises(AssertionError, match=r"causal=True\) gave the right answer but allocated"):
        check.tiled_attention(whole_mask)


def test_a_check_of_an_unanswered_exercise_shows_only_its_message():
    def blank(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError) as info:
        check.online_update(blank)
    assert info.value._render_traceback_() == [str(info.value)]


def test_traffic_with_floor_block_size_is_named():
    def floor_blocks(n, d, sram):
        b_c = max(1, sram // (4 * d))
        return standard_traffic(n, d), flash_traffic(n, d, min(b_c, d), b_c)

    with pytest.raises(AssertionError, match=r"Likely cause: B_c = ceil\(M / 4d\)"):
        check.hbm_traffic(floor_blocks)
