"""A registry of published model shapes, and what each shape costs in cache and weights.

Each entry copies the fields of the model's published ``config.json`` that decide the size of
its KV cache and of its weights. Parameter counts are computed from those shapes (they are
not typed in), so a weights line in a plot is derived the same way as the cache line.

The cache rules handled here:
- MHA / GQA / MQA: each layer stores K and V for ``kv_heads`` heads of ``head_dim`` elements.
- MLA (DeepSeek-V2/V3): each layer stores one latent of ``kv_lora_rank + qk_rope_head_dim``
  elements per token (no factor 2: keys and values are both rebuilt from it).
- Sliding windows: a windowed layer keeps at most ``window`` tokens (a rolling buffer), so its
  share of the cache stops growing at the window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from helpers.kv_cache_size import cache_bytes as _cache_bytes
from helpers.kv_cache_size import crossover_tokens as _crossover_tokens
from helpers.kv_cache_size import kv_bytes_per_token
from helpers.mla import mla_elements_per_token
from helpers.units import positive_int


@dataclass(frozen=True)
class ModelConfig:
    """The shape of one decoder-only transformer, as its config.json gives it."""

    name: str
    source: str  # where the numbers come from
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int  # K/V heads that are cached (1 for MQA); ignored for MLA
    head_dim: int
    intermediate: int  # MLP width of a dense layer
    vocab: int
    max_context: int
    tied_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU/GeGLU: 3 matrices; False: plain 2-matrix MLP
    bias: str = "none"  # "none", "qkv" (Q/K/V projections only) or "all" (every linear)
    layer_norm: bool = False  # LayerNorm (weight + bias) instead of RMSNorm (weight)
    norms_per_layer: int = 2
    learned_positions: bool = False  # GPT-2 style position table of max_context x hidden
    window: int | None = None  # sliding-window length in tokens
    windowed_layers: int = 0  # how many of the layers use the window
    # Mixture of experts: layers from first_dense_layers on carry routed + shared experts.
    experts: int = 0
    shared_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    first_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek): what is cached is the latent.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self):
        for field in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "intermediate", "vocab", "max_context"):
            positive_int(field, getattr(self, field))
        if self.bias not in ("none", "qkv", "all"):
            raise ValueError(f"bias must be one of 'none', 'qkv', 'all'; got {self.bias!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.windowed_layers > self.layers:
            raise ValueError(f"windowed_layers ({self.windowed_layers}) cannot exceed layers ({self.layers})")
        if self.window is not None:
            positive_int("window", self.window)
        positive_int("windowed_layers", self.windowed_layers, allow_zero=True)
        if (self.window is None) != (self.windowed_layers == 0):
            raise ValueError("give both window and windowed_layers, or neither")

    # ---- cache -------------------------------------------------------------------------
    @property
    def attention(self) -> str:
        """'MLA', 'MQA', 'MHA' or 'GQA'."""
        if self.kv_lora_rank:
            return "MLA"
        if self.kv_heads == 1:
            return "MQA"
        return "MHA" if self.kv_heads == self.q_heads else "GQA"

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Bytes one token adds to the cache across all layers, before any window is full."""
        if self.attention == "MLA":
            elements = mla_elements_per_token(self.kv_lora_rank, self.qk_rope_head_dim, self.layers)
            return elements * positive_int("bytes_per_element", bytes_per_element)
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, bytes_per_element)

    def cache_bytes(self, tokens: int, batch: int = 1, bytes_per_element: int = 2) -> int:
        """Bytes of cache for ``batch`` sequences of ``tokens`` tokens, windows applied."""
        per_layer = self.kv_bytes_per_token(bytes_per_element) // self.layers
        tokens = positive_int("tokens", tokens, allow_zero=True)
        # Token rows held, summed over layers: full layers hold every token, windowed ones the window.
        rows = (self.layers - self.windowed_layers) * tokens + self.windowed_layers * min(tokens, self.window or 0)
        return _cache_bytes(rows, per_layer, batch)

    def crossover_tokens(self, batch: int = 1, bytes_per_element: int = 2, weight_bytes_per_element: int = 2) -> int | None:
        """Smallest token count at which the cache of ``batch`` sequences outweighs the weights.

        None when it never does (every layer windowed and the full window still smaller).
        """
        weights = self.weight_bytes(weight_bytes_per_element)
        per_layer = self.kv_bytes_per_token(bytes_per_element) // self.layers
        n = _crossover_tokens(weights, per_layer * self.layers, batch)
        if self.window is None or n <= self.window:
            return n
        full_layers = self.layers - self.windowed_layers
        if full_layers == 0:
            return None
        # Past the window only the full layers grow, on top of the windowed layers' fixed share.
        capped = _cache_bytes(self.window, per_layer * self.windowed_layers, batch)
        return _crossover_tokens(weights - capped, per_layer * full_layers, batch)

    # ---- weights -----------------------------------------------------------------------
    def _attention_params(self) -> int:
        h = self.hidden
        if self.attention == "MLA":
            nope, rope, v, heads = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim, self.q_heads
            q_out = heads * (nope + rope)
            # Low-rank paths, each with a norm on its latent: hidden -> q latent -> heads; hidden -> kv latent + rope key.
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out) if self.q_lora_rank else h * q_out
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank + self.kv_lora_rank * heads * (nope + v)
            return q + kv + heads * v * h
        q_width, kv_width = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        weights = 2 * h * q_width + 2 * h * kv_width
        biases = {"none": 0, "qkv": q_width + 2 * kv_width, "all": q_width + 2 * kv_width + h}[self.bias]
        return weights + biases

    def _mlp_params(self, width: int, matrices: int) -> int:
        biases = width + self.hidden if self.bias == "all" else 0
        return matrices * self.hidden * width + biases

    def _layer_params(self, layer: int, active_only: bool) -> int:
        norm = self.hidden * (2 if self.layer_norm else 1)
        total = self._attention_params() + self.norms_per_layer * norm
        if self.experts and layer >= self.first_dense_layers:
            routed = self.experts_per_token if active_only else self.experts
            expert = self._mlp_params(self.moe_intermediate or self.intermediate, 3)
            total += (routed + self.shared_experts) * expert + self.hidden * self.experts  # + router
        else:
            total += self._mlp_params(self.intermediate, 3 if self.gated_mlp else 2)
        return total

    def _param_count(self, active_only: bool) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if self.learned_positions:
            embed += self.max_context * self.hidden
        final_norm = self.hidden * (2 if self.layer_norm else 1)
        return embed + final_norm + sum(self._layer_params(i, active_only) for i in range(self.layers))

    def param_count(self) -> int:
        """Parameters stored, computed from the shapes (all experts of an MoE model)."""
        return self._param_count(active_only=False)

    def active_param_count(self) -> int:
        """Parameters used for one token (MoE: only the routed and shared experts it visits)."""
        return self._param_count(active_only=True)

    def weight_bytes(self, bytes_per_element: int = 2) -> int:
        """Bytes of the weights at ``bytes_per_element`` (2 for bf16/fp16)."""
        return self.param_count() * positive_int("bytes_per_element", bytes_per_element)

    def with_shape(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (e.g. fewer KV heads), validated like the original."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}, config.json"


MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in [
        ModelConfig("GPT-2 small", _hf("openai-community/gpt2"), layers=12, hidden=768, q_heads=12, kv_heads=12,
                    head_dim=64, intermediate=3072, vocab=50257, max_context=1024, tied_embeddings=True,
                    gated_mlp=False, bias="all", layer_norm=True, learned_positions=True),
        ModelConfig("Llama-2-7B", _hf("meta-llama/Llama-2-7b-hf"), layers=32, hidden=4096, q_heads=32, kv_heads=32,
                    head_dim=128, intermediate=11008, vocab=32000, max_context=4096),
        ModelConfig("Llama-2-70B", _hf("meta-llama/Llama-2-70b-hf"), layers=80, hidden=8192, q_heads=64, kv_heads=8,
                    head_dim=128, intermediate=28672, vocab=32000, max_context=4096),
        ModelConfig("Llama-3-8B", _hf("meta-llama/Meta-Llama-3-8B"), layers=32, hidden=4096, q_heads=32, kv_heads=8,
                    head_dim=128, intermediate=14336, vocab=128256, max_context=8192),
        ModelConfig("Llama-3-70B", _hf("meta-llama/Meta-Llama-3-70B"), layers=80, hidden=8192, q_heads=64, kv_heads=8,
                    head_dim=128, intermediate=28672, vocab=128256, max_context=8192),
        ModelConfig("Llama-3.1-405B", _hf("meta-llama/Llama-3.1-405B"), layers=126, hidden=16384, q_heads=128,
                    kv_heads=8, head_dim=128, intermediate=53248, vocab=128256, max_context=131072),
        ModelConfig("Mistral-7B-v0.1", _hf("mistralai/Mistral-7B-v0.1"), layers=32, hidden=4096, q_heads=32,
                    kv_heads=8, head_dim=128, intermediate=14336, vocab=32000, max_context=32768,
                    window=4096, windowed_layers=32),
        ModelConfig("Mixtral-8x7B", _hf("mistralai/Mixtral-8x7B-v0.1"), layers=32, hidden=4096, q_heads=32,
                    kv_heads=8, head_dim=128, intermediate=14336, vocab=32000, max_context=32768,
                    experts=8, experts_per_token=2),
        ModelConfig("Falcon-7B", _hf("tiiuae/falcon-7b"), layers=32, hidden=4544, q_heads=71, kv_heads=1,
                    head_dim=64, intermediate=4 * 4544, vocab=65024, max_context=2048, tied_embeddings=True,
                    gated_mlp=False, layer_norm=True, norms_per_layer=1),
        ModelConfig("Qwen2.5-7B", _hf("Qwen/Qwen2.5-7B"), layers=28, hidden=3584, q_heads=28, kv_heads=4,
                    head_dim=128, intermediate=18944, vocab=152064, max_context=131072, bias="qkv"),
        ModelConfig("Gemma-2-9B", _hf("google/gemma-2-9b"), layers=42, hidden=3584, q_heads=16, kv_heads=8,
                    head_dim=256, intermediate=14336, vocab=256000, max_context=8192, tied_embeddings=True,
                    norms_per_layer=4, window=4096, windowed_layers=21),
        ModelConfig("DeepSeek-V2", _hf("deepseek-ai/DeepSeek-V2"), layers=60, hidden=5120, q_heads=128,
                    kv_heads=128, head_dim=128, intermediate=12288, vocab=102400, max_context=163840,
                    experts=160, shared_experts=2, experts_per_token=6, moe_intermediate=1536, first_dense_layers=1,
                    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        ModelConfig("DeepSeek-V3", _hf("deepseek-ai/DeepSeek-V3"), layers=61, hidden=7168, q_heads=128,
                    kv_heads=128, head_dim=128, intermediate=18432, vocab=129280, max_context=163840,
                    experts=256, shared_experts=1, experts_per_token=8, moe_intermediate=2048, first_dense_layers=3,
                    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    ]
}


def get_model(name: str) -> ModelConfig:
    """The registry entry called ``name`` (case-insensitive); ValueError lists the known names."""
    for key, model in MODELS.items():
        if isinstance(name, str) and key.lower() == name.strip().lower():
            return model
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")


def reshaped(name: str, layers: int, kv_heads: int, head_dim: int) -> ModelConfig:
    """The registry model ``name`` with its layer count, KV heads and head dim replaced.

    Windowed layers keep their share of the layers; MLA models keep their latent (their
    kv_heads and head_dim do not set the cache).
    """
    base = get_model(name)
    windowed = round(base.windowed_layers * layers / base.layers)
    return base.with_shape(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        windowed_layers=windowed,
        window=base.window if windowed else None,
        first_dense_layers=min(base.first_dense_layers, layers),
    )
