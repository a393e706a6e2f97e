"""The lesson 06 checkers: right answers pass with one line, typical mistakes get named."""

import numpy as np
import pytest

from helpers.checks import lesson06 as check


def good_window(n, budget):
    return np.arange(n) >= n - budget


def good_sinks(n, budget, sinks):
    return (np.arange(n) < sinks) | good_window(n, budget - sinks)


def good_heavy_row(scores, budget, recent):
    scores = np.asarray(scores)
    keep = good_window(len(scores), recent) if recent else np.zeros(len(scores), dtype=bool)
    older = np.flatnonzero(~keep)
    room = min(budget - int(keep.sum()), len(older))
    if room > 0:
        keep[older[np.argsort(-scores[older])[:room]]] = True
    return keep


def good_heavy(scores, budget, recent):
    return np.stack([good_heavy_row(row, budget, recent) for row in np.asarray(scores)])


def good_ceiling(policy, n, budget, per_token):
    return (n if policy == "full" else min(n, budget)) * per_token


def good_quality(policy_logits, full_logits, targets):
    shifted = policy_logits - policy_logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(targets)), targets].mean()), float(
        (policy_logits.argmax(1) == full_logits.argmax(1)).mean())


def test_right_answers_pass_with_one_deterministic_line(capsys):
    for _ in range(2):
        check.window_mask(good_window)
        check.sinks_mask(good_sinks)
        check.heavy_mask(good_heavy)
        check.memory_ceiling(good_ceiling)
        check.quality(good_quality)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == ["window_mask: all 25 cases correct.", "sinks_mask: all 25 cases correct.",
                         "heavy_mask: all 26 cases correct.", "memory_ceiling: all 24 cases correct.",
                         "quality: all 24 cases correct."]
    assert lines[5:] == lines[:5]


def test_window_off_by_one_names_the_positions():
    with pytest.raises(AssertionError, match=r"window_mask\(n=10, budget=4\) kept positions \[5, 6, 7, 8, 9\], "
                                             r"expected \[6, 7, 8, 9\]"):
        check.window_mask(lambda n, budget: np.arange(n) >= n - budget - 1)


def test_mask_of_integers_is_a_type_error_message():
    with pytest.raises(AssertionError, match="expected booleans"):
        check.window_mask(lambda n, budget: (np.arange(n) >= n - budget).astype(int))


def test_sinks_with_a_full_length_window_exceeds_the_budget():
    with pytest.raises(AssertionError, match="more than the budget"):
        check.sinks_mask(lambda n, budget, sinks: (np.arange(n) < sinks) | good_window(n, budget))


def test_heavy_hitters_chosen_among_all_tokens():
    def wrong_row(scores, budget, recent):  # picks the top scores without excluding the recent window
        keep = good_window(len(scores), recent) if recent else np.zeros(len(scores), dtype=bool)
        top = np.argsort(-scores)[: max(0, min(budget, len(scores)) - int(keep.sum()))]
        keep[top] = True
        return keep

    with pytest.raises(AssertionError, match=r"(?s)heavy_mask\(scores=np.array\(\[\[1\., 2\., 3\., 9\., 8\., 7\.\]\], dtype=float64\).*"
                                             r"keeps 3 tokens, fewer than min\(n, budget\) = 4"):
        check.heavy_mask(lambda scores, budget, recent: np.stack([wrong_row(r, budget, recent) for r in np.asarray(scores)]))


def test_heavy_hitters_with_a_negative_zero_slice_are_named():
    def minus_zero(scores, budget, recent):  # keep[:, -recent:] keeps every token when recent is 0
        scores = np.asarray(scores)
        keep = np.zeros(scores.shape, dtype=bool)
        keep[:, -recent:] = True
        for head in range(len(scores)):
            older = np.flatnonzero(~keep[head])
            keep[head, older[np.argsort(-scores[head, older])[: max(0, min(budget, scores.shape[1]) - recent)]]] = True
        return keep

    with pytest.raises(AssertionError, match=r"more than min\(n, budget\).*x\[-recent:\] is x\[0:\]"):
        check.heavy_mask(minus_zero)


def test_heavy_hitters_from_scores_summed_over_heads_are_named():
    def shared(scores, budget, recent):  # one choice for every head, from the summed scores
        scores = np.asarray(scores)
        return np.tile(good_heavy_row(scores.sum(axis=0), budget, recent), (len(scores), 1))

    with pytest.raises(AssertionError, match=r"(?s)head 0 kept positions.*every head kept the same tokens"):
        check.heavy_mask(shared)


def test_heavy_hitters_of_one_dimension_name_the_shape():
    with pytest.raises(AssertionError, match=r"shape \(8,\), expected \(2, 8\) \(one row per head"):
        check.heavy_mask(lambda scores, budget, recent: good_heavy_row(np.asarray(scores)[0], budget, recent))


def test_memory_ceiling_mistakes():
    with pytest.raises(AssertionError, match="shorter than the budget holds only its own tokens"):
        check.memory_ceiling(lambda policy, n, budget, per_token: (n if policy == "full" else budget) * per_token)
    with pytest.raises(AssertionError, match="the budget does not apply"):
        check.memory_ceiling(lambda policy, n, budget, per_token: min(n, budget) * per_token)


def test_quality_overflowing_softmax_is_named():
    def unstable(policy_logits, full_logits, targets):
        probs = np.exp(policy_logits) / np.exp(policy_logits).sum(axis=1, keepdims=True)
        return float(-np.log(probs[np.arange(len(targets)), targets]).mean()), good_quality(policy_logits, full_logits, targets)[1]

    with np.errstate(all="ignore"), pytest.raises(AssertionError, match="inf or nan: exp of logits near 1000 overflows"):
        check.quality(unstable)


def test_quality_unstable_or_wrong():
    with pytest.raises(AssertionError, match=r"quality\(policy_logits=.*\) returned \(.*\), expected \(.*\) \(item 1 differs\)"):
        check.quality(lambda p, f, t: (good_quality(p, f, t)[0], 1.0))


def test_unanswered_exercise_says_so():
    def blank(*args):
        raise NotImplementedError()

    for checker in (check.window_mask, check.sinks_mask, check.heavy_mask, check.memory_ceiling, check.quality):
        with pytest.raises(NotImplementedError, match="not answered yet"):
            checker(blank)


def test_sinks_with_one_sink_too_many_names_the_sinks_not_the_window():
    def extra_sink(n, budget, sinks):
        keep = np.arange(n) <= sinks  # positions 0 .. sinks: one too many
        keep[max(sinks, n - (budget - sinks)):] = True
        return keep

    with pytest.raises(AssertionError) as info:
        check.sinks_mask(extra_sink)
    message = str(info.value)
    assert "between the sinks and the window; the sinks are positions 0 .. sinks - 1" in message
    assert "the window is budget - sinks long" not in message


@pytest.mark.parametrize("scale", ["count", "percent"])
def test_quality_agreement_as_a_count_or_percent_is_named(scale):
    def wrong(policy_logits, full_logits, targets):
        shifted = policy_logits - policy_logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        same = policy_logits.argmax(axis=1) == full_logits.argmax(axis=1)
        return float(-log_probs[np.arange(len(targets)), targets].mean()), float(same.sum() if scale == "count"
                                                                                 else 100 * same.mean())

    with pytest.raises(AssertionError, match="agreement is a share between 0 and 1"):
        check.quality(wrong)
