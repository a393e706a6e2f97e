"""helpers.decode_panel: the recorded decode steps, the figure of one step, and the slider."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from conftest import differing_pixels

from helpers.llama import LlamaConfig, LlamaForCausalLM, generate
from helpers.panels import decode as panel
from helpers.panels import output as panel_output

TINY = LlamaConfig(vocab_size=257, layers=2, hidden=32, q_heads=4, kv_heads=2, head_dim=8, intermediate=48,
                   max_positions=32)
PROMPT = torch.tensor([[256, 82, 101, 116]])  # BOS "Ret"
NEW = 6


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(TINY).eval()


@pytest.fixture(scope="module")
def steps(model):
    return panel.record_decode(model, PROMPT, NEW)


def test_one_step_per_new_token_and_greedy_tokens(model, steps):
    assert len(steps) == NEW
    assert [s.token for s in steps] == generate(model, PROMPT, NEW)[0, PROMPT.shape[1]:].tolist()


def test_cache_grows_by_one_position_per_step_after_the_prefill(steps):
    prompt = PROMPT.shape[1]
    assert [s.length for s in steps] == list(range(prompt, prompt + NEW))  # step 0 is the prefill
    for s in steps:
        assert s.cache_shape == (1, TINY.kv_heads, s.length, TINY.head_dim)


def test_cache_bytes_follow_the_kv_cache_formula(steps):
    per_token = TINY.as_model_config().kv_bytes_per_token(4)  # float32
    for s in steps:
        assert s.cache_bytes == s.length * per_token
        assert s.cache_bytes == 2 * TINY.layers * TINY.kv_heads * s.length * TINY.head_dim * 4


def test_attention_rows_are_distributions_over_the_cache(steps):
    for s in steps:
        assert isinstance(s.attention, np.ndarray)
        assert s.attention.shape == (TINY.layers, TINY.q_heads, s.length)
        np.testing.assert_allclose(s.attention.sum(-1), 1.0, atol=1e-5)
        assert (s.attention > 0).all()  # the newest token sees every cached position


def test_record_decode_rejects_bad_input(model):
    with pytest.raises(ValueError, match=r"\(1, prompt\)"):
        panel.record_decode(model, PROMPT.repeat(2, 1), 3)
    with pytest.raises(ValueError, match=r"\(1, prompt\)"):
        panel.record_decode(model, PROMPT[0], 3)
    with pytest.raises(ValueError, match="new_tokens"):
        panel.record_decode(model, PROMPT, 0)


def test_record_decode_follows_the_model_dtype(model):
    double = LlamaForCausalLM(TINY).eval()
    double.load_state_dict(model.state_dict())
    double = double.to(torch.float64)
    steps = panel.record_decode(double, PROMPT, 2)
    assert steps[0].cache_bytes == PROMPT.shape[1] * TINY.as_model_config().kv_bytes_per_token(8)


def test_draw_decode_step(steps):
    fig = panel.draw_decode_step(steps, 2, PROMPT)
    assert len(fig.axes) == 3  # cache bars, attention image, colorbar
    bars, attention, _ = fig.axes
    assert [p.get_width() for p in bars.patches] == pytest.approx([steps[2].cache_bytes / TINY.layers / 1024] * 2)
    image = np.ma.filled(np.ma.asarray(attention.get_images()[0].get_array(), dtype=float), np.nan)
    assert image.shape == (TINY.layers * TINY.q_heads, steps[-1].length)  # every position the generation caches
    np.testing.assert_allclose(image[:, : steps[2].length], steps[2].attention.reshape(-1, steps[2].length))
    assert np.isnan(image[:, steps[2].length:]).all()  # not cached yet: blank
    assert attention.get_title().startswith("step 2:")
    assert str((1, TINY.kv_heads, steps[2].length, TINY.head_dim)) in bars.get_title()


@pytest.mark.parametrize("step", [-1, NEW, 100])
def test_draw_decode_step_rejects_steps_out_of_range(steps, step):
    with pytest.raises(ValueError, match=f"between 0 and {NEW - 1}"):
        panel.draw_decode_step(steps, step, PROMPT)


def test_panel_redraws_once_per_slider_move(model, monkeypatch):

    shown = []
    monkeypatch.setattr(panel_output, "display", shown.append)
    box = panel.decode_panel(model, PROMPT, new_tokens=4)
    slider = box.children[0]
    assert (slider.min, slider.max, slider.value) == (0, 3, 0)
    count = len(shown)
    assert count <= 1
    slider.value = 2
    assert len(shown) == count + 1 and shown[-1].data.startswith(b"\x89PNG")
    assert plt.get_fignums() == []  # each figure closed after it is shown


def test_the_view_in_place_draws_what_a_fresh_figure_draws(steps):
    view = panel.DecodeView(steps, PROMPT)
    view.freeze()
    for step in (NEW - 1, 0, 2, 1):  # back and forth over the frozen background
        view.move(step)
        fresh = panel.draw_decode_step(steps, step, PROMPT)
        assert differing_pixels(view.fig, fresh) == 0, step
        plt.close(fresh)
    with pytest.raises(ValueError, match="between 0 and"):
        view.move(NEW)


def test_shown_layers_spreads_over_a_deep_model():
    assert panel.shown_layers(4) == [0, 1, 2, 3]
    assert panel.shown_layers(30) == [0, 6, 12, 17, 23, 29]
    assert panel.shown_layers(30, 10)[0] == 0 and panel.shown_layers(30, 10)[-1] == 29


def test_draw_decode_step_with_chosen_layers_and_decoder(steps):
    fig = panel.draw_decode_step(steps, 1, PROMPT, decode=lambda ids: "".join(f"<{i}>" for i in ids), layers=[1])
    bars, attention, _ = fig.axes
    assert len(bars.patches) == TINY.layers  # the cache of every layer is still drawn
    image = np.ma.filled(np.ma.asarray(attention.get_images()[0].get_array(), dtype=float), np.nan)
    np.testing.assert_allclose(image[:, : steps[1].length], steps[1].attention[1])  # only layer 1's heads
    assert "<256><82>" in attention.get_title() or f"<{steps[1].token}>" in attention.get_title()
    with pytest.raises(ValueError, match="layers must be"):
        panel.draw_decode_step(steps, 1, PROMPT, layers=[TINY.layers])
