"""helpers.text_data: byte tokens, the standard library's docstrings, the split and the token stream."""

from collections import defaultdict
from pathlib import PurePosixPath

import pytest
import torch

from helpers import text_data
from helpers.text_data import BOS, VOCAB_SIZE, decode, encode, split, stdlib_docstrings, token_stream


@pytest.fixture(scope="module")
def docs():
    return stdlib_docstrings()


# ---- tokens ---------------------------------------------------------------------------------
def test_bos_and_vocab_size():
    assert BOS == 256 and VOCAB_SIZE == 257
    assert encode("") == [BOS]


@pytest.mark.parametrize("text", ["Return the sum.", "h\u00e9llo \u2211 \U0001F40D\n\ttabs", ""])
def test_encode_decode_round_trip(text):
    ids = encode(text)
    assert ids[0] == BOS and BOS not in ids[1:]
    assert ids[1:] == list(text.encode("utf-8"))
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert decode(ids) == text
    assert decode(torch.tensor(ids)) == text  # a tensor of ids works too


def test_encode_is_utf8_bytes():
    assert encode("\u00e9") == [BOS, 0xC3, 0xA9]


def test_decode_drops_every_bos_and_replaces_invalid_bytes():
    assert decode([BOS, 65, BOS, 66]) == "AB"
    assert decode([BOS, 0xFF, 65]) == "\ufffdA"
    assert decode([0xC3]) == "\ufffd"  # a cut-off character


# ---- the documents --------------------------------------------------------------------------
def test_docstrings_are_plentiful_long_enough_and_unique(docs):
    assert isinstance(docs, tuple) and len(docs) > 1000
    assert all(isinstance(m, str) and isinstance(d, str) for m, d in docs)
    assert all(len(d) >= 40 for _, d in docs)
    assert len(set(docs)) == len(docs)


def test_docstrings_are_deterministic(docs):
    again = stdlib_docstrings.__wrapped__()  # read the files again, past the cache
    assert again == docs and again is not docs
    assert stdlib_docstrings() is docs
    assert [m for m, _ in docs] == sorted(m for m, _ in docs)  # files in sorted order


def test_docstrings_leave_out_tests_and_skipped_packages(docs):
    modules = {m for m, _ in docs}
    for module in modules:
        path = PurePosixPath(module)
        assert not path.is_absolute() and path.suffix == ".py"
        assert not set(path.parts) & text_data.SKIP, module
        assert "test" not in path.parts and "tests" not in path.parts, module
    assert "os.py" in modules and "json/__init__.py" in modules


# ---- the split ------------------------------------------------------------------------------
def test_split_is_deterministic_and_keeps_every_document(docs):
    train, held_out = split(docs)
    assert (train, held_out) == split(docs)
    assert len(train) + len(held_out) == len(docs)
    assert sorted(train + held_out) == sorted(d for _, d in docs)


def test_split_is_by_module(docs):
    by_module = defaultdict(list)
    for module, doc in docs:
        by_module[module].append((module, doc))
    sides = {}
    for module, group in by_module.items():
        train, held_out = split(group)
        assert not (train and held_out), f"{module} is on both sides"
        sides[module] = bool(held_out)
    assert 0 < sum(sides.values()) < len(sides)
    train, held_out = split(docs)
    assert held_out == [d for m, d in docs if sides[m]]
    assert train == [d for m, d in docs if not sides[m]]


def test_held_out_is_roughly_five_percent(docs):
    _, held_out = split(docs)
    assert 0.02 < len(held_out) / len(docs) < 0.12
    assert split(docs, held_out_percent=0)[1] == [] and split(docs, held_out_percent=100)[0] == []
    assert len(split(docs, held_out_percent=50)[1]) > 5 * len(held_out)


def test_split_of_synthetic_documents():
    docs = [(f"pkg/mod{i}.py", f"doc {i} {j}") for i in range(200) for j in range(3)]
    train, held_out = split(docs)
    assert 0 < len(held_out) < 60 and len(held_out) % 3 == 0  # whole modules
    assert set(train).isdisjoint(held_out)


# ---- the token stream -----------------------------------------------------------------------
TEXTS = [f"document number {i}: \u00e9" for i in range(20)]


def test_token_stream_in_order():
    stream = token_stream(TEXTS)
    assert stream.dtype == torch.long and stream.ndim == 1
    assert stream.tolist() == [t for text in TEXTS for t in encode(text)]
    assert stream[0] == BOS and int((stream == BOS).sum()) == len(TEXTS)


def test_token_stream_shuffled_by_a_seeded_generator():
    first = token_stream(TEXTS, torch.Generator().manual_seed(0))
    assert torch.equal(first, token_stream(TEXTS, torch.Generator().manual_seed(0)))
    assert not torch.equal(first, token_stream(TEXTS, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, token_stream(TEXTS))
    assert first[0] == BOS and first.shape == token_stream(TEXTS).shape
    documents = [decode(d) for d in _documents(first)]
    assert sorted(documents) == sorted(TEXTS) and documents != TEXTS


def _documents(stream):
    """The stream cut at each BOS."""
    starts = (stream == BOS).nonzero().flatten().tolist() + [len(stream)]
    return [stream[a:b].tolist() for a, b in zip(starts, starts[1:])]


def test_token_stream_of_nothing():
    assert token_stream([]).shape == (0,)
    assert token_stream([], torch.Generator().manual_seed(0)).shape == (0,)


def test_language_reference_is_long_english_prose():
    text = text_data.language_reference("execmodel")
    assert len(text) > 5000 and text.startswith("Execution model") and " the " in text
    assert text == text_data.language_reference("execmodel")


def test_language_reference_rejects_unknown_topics():
    with pytest.raises(ValueError, match="unknown topic 'nope'; e.g."):
        text_data.language_reference("nope")
