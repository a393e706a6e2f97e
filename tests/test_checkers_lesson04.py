"""The lesson 04 checkers: right answers pass with one line, typical mistakes get named."""

import math

import pytest
import torch

from helpers.checks import lesson04 as check


def good_append(k_cache, v_cache, k_new, v_new):
    return torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)


def good_attend(q, k, v):
    n_new, n_total = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    visible = torch.arange(n_total)[None, :] <= torch.arange(n_new)[:, None] + (n_total - n_new)
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1) @ v


def good_bytes(config, batch, dtype):
    return 2 * config.layers * config.kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size() * batch


def test_right_answers_pass_with_one_deterministic_line(capsys):
    check.append_to_cache(good_append)
    check.attend_new(good_attend)
    check.bytes_appended(good_bytes)
    assert capsys.readouterr().out.splitlines() == ["append_to_cache: all 23 cases correct.",
                                                    "attend_new: all 24 cases correct.",
                                                    "bytes_appended: all 22 cases correct."]


def test_append_on_the_wrong_dim_fails_with_the_layout_hint():
    with pytest.raises(AssertionError, match="concatenate along dim 2"):
        check.append_to_cache(lambda k, v, kn, vn: (torch.cat([k, kn], dim=1), torch.cat([v, vn], dim=1)))


def test_attend_with_a_top_left_mask_is_named():
    def top_left(q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    with pytest.raises(AssertionError, match="aligned to the top-left"):
        check.attend_new(top_left)


def test_attend_without_the_sqrt_d_scale_is_named():
    with pytest.raises(AssertionError, match=r"not divided by sqrt\(d\)"):
        check.attend_new(lambda q, k, v: good_attend(q * math.sqrt(q.shape[-1]), k, v))


@pytest.mark.parametrize("wrong, cause", [
    (lambda c, b, d: good_bytes(c, b, d) * 8, "bits, not bytes"),
    (lambda c, b, d: good_bytes(c, b, d) // 2, "keys only"),
    (lambda c, b, d: good_bytes(c, b, d) * c.q_heads // c.kv_heads, "q_heads where the cache holds kv_heads"),
])
def test_bytes_appended_mistakes_are_named(wrong, cause):
    with pytest.raises(AssertionError, match=cause):
        check.bytes_appended(wrong)


def test_bytes_appended_names_every_mistake_its_factor_fits():
    # Forgetting the batch fails first where batch equals another factor of the answer: say both.
    with pytest.raises(AssertionError) as info:
        check.bytes_appended(lambda c, b, d: good_bytes(c, 1, d))
    message = str(info.value)
    assert "one sequence, not the batch" in message
    assert "Likely cause: the answer counts one sequence" in message or "fits more than one mistake" in message
