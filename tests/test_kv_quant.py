"""Tests for helpers.kv_quant: int8 / float8 storage of keys and values and the errors it causes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.kv_quant import (
    FORMATS,
    GRANULARITIES,
    KVSample,
    compute_scale,
    dequantize,
    error_table,
    format_max,
    magnitude_sweep,
    quantize,
    roundtrip,
    storage_errors,
    synthetic_qkv,
)


def data(shape=(32, 16), seed=0, std=1.0):
    return np.random.default_rng(seed).normal(0.0, std, size=shape)


# ---- format_max and compute_scale --------------------------------------------------------


@pytest.mark.parametrize("fmt, largest", [("int8", 127.0), ("e4m3", 448.0), ("e5m2", 57344.0)])
def test_format_max(fmt, largest):
    assert format_max(fmt) == largest
    assert isinstance(format_max(fmt), float)


@pytest.mark.parametrize("fmt", ["int4", "fp8", "E4M3", "bf16", "", None])
def test_format_max_unknown_format(fmt):
    with pytest.raises(ValueError, match=r"fmt must be one of int8, e4m3, e5m2"):
        format_max(fmt)


@pytest.mark.parametrize("granularity, shape", [("tensor", (1, 1)), ("channel", (1, 16)), ("token", (32, 1))])
@pytest.mark.parametrize("fmt", FORMATS)
def test_compute_scale_shapes_and_values(fmt, granularity, shape):
    x = data((32, 16))
    scale = compute_scale(x, fmt, granularity)
    assert scale.shape == shape
    axis = {"tensor": None, "channel": 0, "token": 1}[granularity]
    amax = np.max(np.abs(x), axis=axis, keepdims=True) if axis is not None else np.max(np.abs(x)).reshape(1, 1)
    np.testing.assert_allclose(scale, amax / format_max(fmt), rtol=1e-12)


def test_compute_scale_default_is_tensor():
    x = data()
    np.testing.assert_array_equal(compute_scale(x, "int8"), compute_scale(x, "int8", "tensor"))


def test_all_zero_groups_get_scale_one():
    x = np.zeros((4, 3))
    x[1, 2] = -254.0  # one non-zero element: channel 2, token 1
    assert compute_scale(np.zeros((4, 3)), "int8").tolist() == [[1.0]]
    np.testing.assert_array_equal(compute_scale(x, "int8", "channel"), [[1.0, 1.0, 2.0]])
    np.testing.assert_array_equal(compute_scale(x, "int8", "token"), [[1.0], [2.0], [1.0], [1.0]])
    # ... and a zero group round-trips to zeros, without NaN.
    for fmt in FORMATS:
        for granularity in GRANULARITIES:
            back = roundtrip(x, fmt, granularity)
            assert np.all(np.isfinite(back))
            assert back[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("granularity", ["tensors", "head", "", None])
def test_compute_scale_unknown_granularity(granularity):
    with pytest.raises(ValueError, match=r"granularity must be one of tensor, channel, token"):
        compute_scale(data(), "int8", granularity)


# ---- int8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_int8_codes_and_error_bound(granularity):
    x = data((40, 24), seed=1) * np.linspace(0.1, 10, 24)  # channels of different sizes
    codes, scale = quantize(x, "int8", granularity)
    assert codes.dtype == np.int8 and codes.shape == x.shape and codes.nbytes == x.size
    assert codes.min() >= -127 and codes.max() <= 127
    back = dequantize(codes, scale, "int8")
    assert back.dtype == np.float32
    bound = np.broadcast_to(scale, x.shape) / 2
    assert np.all(np.abs(back - x) <= bound * (1 + 1e-6) + 1e-6 * np.abs(x))
    np.testing.assert_array_equal(back, roundtrip(x, "int8", granularity))


@pytest.mark.parametrize("granularity, axis", [("tensor", None), ("channel", 0), ("token", 1)])
def test_int8_group_maximum_maps_to_127(granularity, axis):
    x = data((30, 20), seed=2)
    codes, _ = quantize(x, "int8", granularity)
    if axis is None:
        i = np.unravel_index(np.argmax(np.abs(x)), x.shape)
        assert abs(int(codes[i])) == 127 and np.sign(codes[i]) == np.sign(x[i])
        assert np.abs(codes).max() == 127
    else:
        idx = np.expand_dims(np.argmax(np.abs(x), axis=axis), axis)
        peak = np.take_along_axis(codes.astype(int), idx, axis)
        assert np.all(np.abs(peak) == 127)
        np.testing.assert_array_equal(np.sign(peak), np.sign(np.take_along_axis(x, idx, axis)))


def test_int8_per_channel_beats_per_tensor_on_an_outlier_channel():
    x = data((64, 8), seed=3)
    x[:, 3] *= 100
    err = {g: np.abs(roundtrip(x, "int8", g) - x)[:, [0, 1, 2, 4, 5, 6, 7]].max() for g in ("tensor", "channel")}
    assert err["channel"] < err["tensor"] / 20


# ---- float8 ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, mantissa_bits", [("e4m3", 3), ("e5m2", 2)])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_float8_codes_are_bytes_and_relative_error_is_bounded(fmt, mantissa_bits, granularity):
    rng = np.random.default_rng(4)
    # Magnitudes spread over two decades below each group's maximum: after scaling they stay
    # in the normal range of both formats (no subnormals).
    x = rng.choice([-1.0, 1.0], size=(48, 16)) * 10 ** rng.uniform(-2, 0, size=(48, 16))
    codes, scale = quantize(x, fmt, granularity)
    assert codes.dtype == np.uint8 and codes.shape == x.shape and codes.nbytes == x.size
    back = dequantize(codes, scale, fmt)
    assert back.dtype == np.float32
    rel = np.abs(back - x) / np.abs(x)
    assert rel.max() < 2.0 ** -(mantissa_bits + 1) * (1 + 1e-6)
    assert rel.max() > 2.0 ** -(mantissa_bits + 3)  # it does round (the test could catch no-op storage)


def test_e4m3_is_more_precise_than_e5m2():
    x = data((64, 32), seed=5)
    err = {fmt: np.linalg.norm(roundtrip(x, fmt) - x) for fmt in ("e4m3", "e5m2")}
    assert err["e4m3"] < err["e5m2"] * 0.75


@pytest.mark.parametrize("fmt, largest", [("int8", 127.0), ("e4m3", 448.0), ("e5m2", 57344.0)])
def test_values_beyond_range_saturate(fmt, largest):
    x = np.array([[1000.0, -1000.0, 1e6, -1e9, 1.0]])
    back = roundtrip(x, fmt, scale=1.0)
    assert np.all(np.isfinite(back))
    assert back[0, 2:4].tolist() == [largest, -largest]
    assert np.abs(back).max() == largest
    if largest < 1000:
        assert back[0, :2].tolist() == [largest, -largest]
    else:  # e5m2 holds 1000 (as its nearest value, 1024)
        np.testing.assert_allclose(back[0, :2], [1000.0, -1000.0], rtol=2.0**-3)
    assert back[0, 4] == 1.0


def test_e4m3_scale_one_and_1000_gives_448():
    codes, scale = quantize(np.array([[1000.0]]), "e4m3", scale=1.0)
    assert codes.dtype == np.uint8
    assert dequantize(codes, scale, "e4m3").tolist() == [[448.0]]


def test_given_scale_overrides_computed_one():
    x = np.array([[0.5, -2.0], [1.0, 3.0]])
    codes, scale = quantize(x, "int8", scale=0.5)
    assert codes.tolist() == [[1, -4], [2, 6]]
    np.testing.assert_array_equal(scale, [[0.5]])


def test_given_per_channel_scale_is_accepted():
    x = data((8, 4), seed=6)
    scale = compute_scale(x, "int8", "channel")
    np.testing.assert_array_equal(quantize(x, "int8", scale=scale)[0], quantize(x, "int8", "channel")[0])


# ---- bf16 --------------------------------------------------------------------------------


def test_bf16_roundtrip_relative_error_below_2_to_minus_8():
    x = data((64, 32), seed=7, std=3.0).astype(np.float32)
    back = roundtrip(x, "bf16")
    assert back.dtype == np.float32
    rel = np.abs(back - x) / np.abs(x)
    assert rel.max() < 2.0**-8
    assert rel.max() > 2.0**-11  # bf16 does round
    # bf16 keeps float32's exponent range: tiny and huge values survive with no scale.
    extremes = np.array([[1e-30, 1e30]], dtype=np.float32)
    np.testing.assert_allclose(roundtrip(extremes, "bf16"), extremes, rtol=2.0**-8)


# ---- validation --------------------------------------------------------------------------

BAD_INPUTS = [
    (np.ones(5), r"shape \(5,\)"),  # 1-D
    (np.float64(1.0), r"shape \(\)"),  # 0-D
    (np.zeros((0, 4)), r"non-empty"),
    (np.zeros((3, 0)), r"non-empty"),
    (np.ones((3, 4), dtype=np.int64), r"floating-point"),
    (np.ones((3, 4), dtype=np.int8), r"floating-point"),
]


@pytest.mark.parametrize("x, message", BAD_INPUTS)
@pytest.mark.parametrize("fmt", ["int8", "e4m3", "bf16"])
def test_roundtrip_rejects_bad_inputs(x, message, fmt):
    with pytest.raises(ValueError, match=rf"^x must .*{message}"):
        roundtrip(x, fmt)


@pytest.mark.parametrize("x, message", BAD_INPUTS)
def test_quantize_and_compute_scale_reject_bad_inputs(x, message):
    with pytest.raises(ValueError, match=message):
        quantize(x, "int8")
    with pytest.raises(ValueError, match=message):
        compute_scale(x, "e5m2", "channel")


@pytest.mark.parametrize("fmt", ["int4", "fp8", "bfloat16"])
def test_unknown_format_raises(fmt):
    x = data()
    with pytest.raises(ValueError, match=r"fmt must be one of"):
        quantize(x, fmt)
    with pytest.raises(ValueError, match=r"fmt must be one of"):
        roundtrip(x, fmt)
    with pytest.raises(ValueError, match=r"fmt must be one of"):
        dequantize(np.zeros((2, 2), dtype=np.uint8), np.ones((1, 1)), fmt)


def test_unknown_granularity_raises_in_quantize():
    with pytest.raises(ValueError, match=r"granularity must be one of"):
        quantize(data(), "e4m3", "row")
    with pytest.raises(ValueError, match=r"granularity must be one of"):
        roundtrip(data(), "int8", "column")


# ---- leading axes ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("granularity, scale_shape", [("tensor", (3, 1, 1)), ("channel", (3, 1, 8)), ("token", (3, 5, 1))])
def test_leading_axes_are_independent_heads(fmt, granularity, scale_shape):
    x = data((3, 5, 8), seed=8) * np.array([0.01, 1.0, 100.0])[:, None, None]  # heads of very different size
    codes, scale = quantize(x, fmt, granularity)
    assert codes.shape == x.shape and scale.shape == scale_shape
    back = dequantize(codes, scale, fmt)
    for h in range(3):
        np.testing.assert_array_equal(back[h], roundtrip(x[h], fmt, granularity))
    assert np.linalg.norm(back - x) / np.linalg.norm(x) < 0.1


# ---- synthetic_qkv -----------------------------------------------------------------------


def test_synthetic_qkv_is_deterministic_and_shaped():
    a = synthetic_qkv(n_q=8, n_kv=100, head_dim=32, seed=3)
    b = synthetic_qkv(n_q=8, n_kv=100, head_dim=32, seed=3)
    c = synthetic_qkv(n_q=8, n_kv=100, head_dim=32, seed=4)
    assert isinstance(a, KVSample)
    assert a.q.shape == (8, 32) and a.k.shape == (100, 32) and a.v.shape == (100, 32)
    for name in ("q", "k", "v"):
        assert getattr(a, name).dtype == np.float32
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not np.allclose(getattr(a, name), getattr(c, name))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_keys_have_large_outlier_channels(seed):
    s = synthetic_qkv(n_q=16, n_kv=256, head_dim=64, outlier_channels=4, seed=seed)
    mean_abs = np.sort(np.abs(s.k).mean(axis=0))
    outliers, others = mean_abs[-4:], mean_abs[:-4]
    assert outliers.min() > 3 * others.max()  # the per-channel offsets can reach ~4
    assert outliers.min() > 10 * np.median(others)
    assert outliers.min() > 10  # near outlier_size = 15


def test_synthetic_values_have_loud_tokens_and_scores_have_requested_spread():
    s = synthetic_qkv(n_q=32, n_kv=512, head_dim=64, loud_tokens=8, value_std=0.02, score_std=2.5, seed=0)
    token_rms = np.sqrt((s.v**2).mean(axis=1))
    assert np.sort(token_rms)[-8:].min() > 5 * np.sort(token_rms)[:-8].max()
    scores = s.q.astype(np.float64) @ s.k.T / np.sqrt(64)
    assert np.std(scores - scores.mean(axis=1, keepdims=True)) == pytest.approx(2.5, rel=1e-3)


# ---- storage_errors and error_table ------------------------------------------------------

SMALL = synthetic_qkv(n_q=16, n_kv=128, head_dim=32, seed=1)


def test_storage_errors_returns_the_three_keys():
    errors = storage_errors(SMALL, "keys", "int8", "tensor")
    assert set(errors) == {"reconstruction", "weights_tv", "output"}
    assert all(isinstance(e, float) and 0 < e < 1 for e in errors.values())


@pytest.mark.parametrize("fmt, granularity, scale", [("int8", "token", None), ("e5m2", "tensor", 1.0), ("bf16", "tensor", None)])
def test_storing_only_values_leaves_the_weights_unchanged(fmt, granularity, scale):
    errors = storage_errors(SMALL, "values", fmt, granularity, scale)
    assert errors["weights_tv"] == 0.0
    assert errors["reconstruction"] > 0 and errors["output"] > 0
    assert storage_errors(SMALL, "keys", fmt, granularity, scale)["weights_tv"] > 0


def test_storage_errors_rejects_unknown_which():
    with pytest.raises(ValueError, match=r"which must be 'keys' or 'values'"):
        storage_errors(SMALL, "queries", "int8", "tensor")


def table():
    return {(r["which"], r["fmt"], r["scaling"]): r for r in error_table()}


def test_error_table_has_26_rows_in_order():
    rows = error_table()
    assert len(rows) == 2 * (1 + 3 * 4) == 26
    assert [r["which"] for r in rows] == ["keys"] * 13 + ["values"] * 13
    assert (rows[0]["fmt"], rows[0]["scaling"]) == ("bf16", "none")
    assert {(r["fmt"], r["scaling"]) for r in rows[1:13]} == {
        (f, s) for f in FORMATS for s in GRANULARITIES + ("uncalibrated",)}
    assert len(table()) == 26  # no duplicate row
    assert all(r["weights_tv"] == 0.0 for r in rows if r["which"] == "values")
    assert all(r["weights_tv"] > 0.0 for r in rows if r["which"] == "keys")


@pytest.mark.parametrize("metric", ["reconstruction", "output"])
def test_keys_are_best_stored_per_channel_in_int8(metric):
    t = table()
    channel = t["keys", "int8", "channel"][metric]
    assert channel < t["keys", "int8", "tensor"][metric]
    assert channel < t["keys", "int8", "token"][metric]


@pytest.mark.parametrize("metric", ["reconstruction", "output"])
def test_values_are_best_stored_per_token_in_int8(metric):
    t = table()
    token = t["values", "int8", "token"][metric]
    assert token < t["values", "int8", "tensor"][metric]
    assert token < t["values", "int8", "channel"][metric]


@pytest.mark.parametrize("which", ["keys", "values"])
@pytest.mark.parametrize("metric", ["reconstruction", "output"])
def test_uncalibrated_int8_is_far_worse_than_any_computed_scale(which, metric):
    t = table()
    worst_calibrated = max(t[which, "int8", g][metric] for g in GRANULARITIES)
    assert t[which, "int8", "uncalibrated"][metric] > 3 * worst_calibrated


@pytest.mark.parametrize("which", ["keys", "values"])
@pytest.mark.parametrize("scaling", GRANULARITIES + ("uncalibrated",))
@pytest.mark.parametrize("metric", ["reconstruction", "output"])
def test_e4m3_beats_e5m2_for_the_same_scaling(which, scaling, metric):
    t = table()
    assert t[which, "e4m3", scaling][metric] < t[which, "e5m2", scaling][metric]


@pytest.mark.parametrize("which", ["keys", "values"])
def test_bf16_beats_every_8_bit_choice(which):
    t = table()
    bf16 = t[which, "bf16", "none"]["reconstruction"]
    assert all(r["reconstruction"] > bf16 for key, r in t.items() if key[0] == which and key[1] != "bf16")


def test_error_table_is_deterministic_for_a_seed():
    assert error_table(0) == error_table(0)
    assert error_table.__wrapped__(0) == error_table(0)  # not only because of the cache


# ---- magnitude_sweep ---------------------------------------------------------------------

STDS = np.logspace(-4, 3, 8)


@pytest.mark.parametrize("fmt", FORMATS)
def test_calibrated_error_is_flat_across_magnitudes(fmt):
    errors = magnitude_sweep(fmt, STDS)
    assert errors.shape == (8,)
    assert np.all(np.isfinite(errors)) and np.all(errors > 0)
    assert errors.max() / errors.min() < 1.5
    assert errors.max() < 0.1


def test_uncalibrated_int8_loses_small_values():
    errors = magnitude_sweep("int8", [1e-4, 1.0, 100.0], scale=1.0)
    assert errors[0] == pytest.approx(1.0, abs=0.01)  # everything rounds to 0
    assert errors[0] > 10 * magnitude_sweep("int8", [1e-4])[0]


def test_uncalibrated_e4m3_underflows_and_saturates():
    small, mid, large = magnitude_sweep("e4m3", [1e-5, 1.0, 1e3], scale=1.0)
    assert np.isfinite([small, mid, large]).all()
    assert mid < 0.05
    assert small > 10 * mid  # underflow below the smallest subnormal
    assert large > 10 * mid  # saturation at 448


def test_magnitude_sweep_is_deterministic():
    np.testing.assert_array_equal(magnitude_sweep("e5m2", STDS, seed=2), magnitude_sweep("e5m2", STDS, seed=2))


def test_error_table_text_lists_every_row_in_percent():
    from helpers.kv_quant import error_table, error_table_text

    lines = error_table_text().splitlines()
    assert lines[0].split()[:3] == ["stored", "format", "scale"]
    assert len(lines) == 1 + len(error_table())
    first = error_table()[0]
    assert lines[1].split()[:3] == [first["which"], first["fmt"], first["scaling"]]
    assert lines[1].split()[3] == f"{100 * first['reconstruction']:.2f}%"


# ---- a real model's keys and values (here a small random Llama: the same code paths) ------------
@pytest.fixture(scope="module")
def llama():
    from helpers.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, layers=2, hidden=32, q_heads=4, kv_heads=2, head_dim=8,
                                         intermediate=48, max_positions=64)).eval()
    ids = torch.randint(0, 40, (1, 24), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_collect_qkv_gives_what_attention_reads(llama):
    from helpers.kv_quant import collect_qkv
    from helpers.llama import KVCache

    model, ids = llama
    q, k, v = collect_qkv(model, ids)
    assert q.shape == (2, 4, 24, 8) and k.shape == v.shape == (2, 2, 24, 8)
    with torch.no_grad():
        cache = KVCache(model.config, capacity=24)
        model(ids, cache, keep_attention=True)
    for layer in range(2):
        torch.testing.assert_close(k[layer], cache.keys[layer, 0])
        # the collected queries and keys give the model's own attention weights
        scores = q[layer] @ k[layer].repeat_interleave(2, dim=0).transpose(-1, -2) / 8 ** 0.5
        mask = torch.ones(24, 24, dtype=torch.bool).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        torch.testing.assert_close(weights, model.attention_weights[layer][0], atol=1e-5, rtol=1e-4)
    assert not model.model.layers[0].self_attn._forward_pre_hooks  # the hooks are gone


def test_collect_qkv_rejects_a_batch(llama):
    from helpers.kv_quant import collect_qkv

    model, ids = llama
    with pytest.raises(ValueError, match=r"\(1, tokens\)"):
        collect_qkv(model, ids.repeat(2, 1))


def test_layer_output_errors_grow_with_coarser_formats(llama):
    from helpers.kv_quant import collect_qkv, layer_output_errors

    q, k, v = collect_qkv(*llama)
    for which in ("keys", "values"):
        int8 = layer_output_errors(q, k, v, which, "int8", "channel")
        e5m2 = layer_output_errors(q, k, v, which, "e5m2", "channel")
        assert int8.shape == (2,) and np.all(int8 > 0) and np.all(e5m2 > int8)
    with pytest.raises(ValueError, match="which"):
        layer_output_errors(q, k, v, "both", "int8", "token")


def test_stored_cache_stores_appended_rows_in_the_format(llama):
    from helpers.kv_quant import StoredKVCache, roundtrip

    model, _ = llama
    cache = StoredKVCache(model.config, "int8", "channel", "token", capacity=8)
    k, v = torch.randn(2, 1, 2, 5, 8, generator=torch.Generator().manual_seed(3))
    held_k, held_v = cache.append(0, k, v)
    np.testing.assert_allclose(held_k.numpy(), roundtrip(k.numpy(), "int8", "channel"), rtol=1e-6)
    np.testing.assert_allclose(held_v.numpy(), roundtrip(v.numpy(), "int8", "token"), rtol=1e-6)
    assert not torch.equal(held_k, k)
    plain = StoredKVCache(model.config, None, capacity=8)
    assert torch.equal(plain.append(0, k, v)[0], k)
    for bad in (dict(fmt="int4"), dict(fmt="int8", key_granularity="head")):
        with pytest.raises(ValueError, match="fmt|key_granularity"):
            StoredKVCache(model.config, **{"fmt": None, **bad})


def test_stored_cache_loss_is_the_model_loss_without_storage_and_changes_with_it(llama):
    from helpers.kv_quant import stored_cache_loss

    model, ids = llama
    with torch.no_grad():
        logits = model(ids)[0, :-1]
    exact = float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]))
    assert stored_cache_loss(model, ids, None) == pytest.approx(exact, abs=1e-6)
    assert stored_cache_loss(model, ids, "e5m2", "tensor", "tensor") != pytest.approx(exact, abs=1e-6)


def test_load_real_results_names_the_script_when_missing(tmp_path):
    from helpers.kv_quant import REAL_RESULTS, load_real_results

    assert load_real_results()["layer_output_error"] and REAL_RESULTS.name == "kv_quant_real.json"
    with pytest.raises(FileNotFoundError, match="scripts/kv_quant_real.py"):
        load_real_results(tmp_path / "none.json")
