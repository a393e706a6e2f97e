"""A small Llama-style decoder in PyTorch, with a KV cache.

The architecture is Llama's: token embedding; per layer RMSNorm -> attention with rotary
position embeddings (RoPE) and grouped-query attention -> residual, RMSNorm -> SwiGLU MLP ->
residual; a final RMSNorm and an output head. Module and parameter names follow the Hugging Face
Llama state-dict layout (``model.layers.0.self_attn.q_proj.weight`` ...), and RoPE uses the same
convention (rotate the two halves of each head), so a Llama checkpoint in that layout loads with
``load_hf_state_dict`` and gives the same logits.

Tensors: token ids (batch, seq); hidden states (batch, seq, hidden); cached keys and values
(batch, kv_heads, seq, head_dim). Positions are absolute: the first new token of a call sits at
the cache's current length.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from helpers.models import ModelConfig
from helpers.units import positive_int


@dataclass(frozen=True)
class LlamaConfig:
    """The shapes of a Llama-style model (the fields of a Hugging Face LlamaConfig that matter here),
    named as in ``helpers.models.ModelConfig`` and the exercises: layers, q_heads, kv_heads, head_dim."""

    vocab_size: int = 257
    layers: int = 4
    hidden: int = 128
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 352
    rope_theta: float = 10000.0
    max_positions: int = 512
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "layers", "hidden", "q_heads", "kv_heads", "head_dim",
                     "intermediate", "max_positions"):
            positive_int(name, getattr(self, name))
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError(f"rope_theta and norm_eps must be positive, got {self.rope_theta} and {self.norm_eps}")

    def as_model_config(self, name: str = "tiny Llama") -> ModelConfig:
        """The same shape as a registry entry, so lesson 01's arithmetic (cache bytes, parameter
        count) applies to it."""
        return ModelConfig(name, "this course", layers=self.layers, hidden=self.hidden, q_heads=self.q_heads,
                           kv_heads=self.kv_heads, head_dim=self.head_dim, intermediate=self.intermediate,
                           vocab=self.vocab_size, max_context=self.max_positions,
                           tied_embeddings=self.tie_embeddings)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class KVCache:
    """Keys and values of every layer: (batch, kv_heads, seq, head_dim) each, grown one step at a time.

    Storage for ``capacity`` positions is allocated once; ``append`` writes the new rows after the
    ones already held and returns views of everything held so far.

    The cache protocol, all the model calls on a cache during a forward pass: ``new_positions(new)``
    (the new tokens' absolute positions, for RoPE); per layer, ``append(layer, k, v)``, then
    ``mask(new, rows)`` and ``score_bias(layer, rows)``; once at the end, ``advance(attention)``,
    with every layer's attention weights when ``needs_attention`` is set. A plain cache adds no
    bias and needs no weights; lesson 06's caches (``helpers.eviction``, ``helpers.layer_sharing``)
    override these to evict, merge or share rows, and lesson 07's engine (``helpers.engine``) to
    run several sequences of different lengths in one pass.
    """

    def __init__(self, config: LlamaConfig, batch: int = 1, capacity: int | None = None,
                 dtype: torch.dtype = torch.float32, device=None):
        self.config = config
        capacity = positive_int("capacity", capacity or config.max_positions)
        shape = (config.layers, positive_int("batch", batch), config.kv_heads, capacity, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # rows held (the same in every layer once a forward pass ends)
        self.position = 0  # absolute position of the next token (more than length once a policy evicts)
        self._pending = 0  # rows appended to the layers of the pass in progress

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v (batch, kv_heads, new, head_dim) for ``layer``; return all held so far."""
        new = k.shape[2]
        end = self.length + new
        if end > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; appending {new} to {self.length} overflows it")
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        self._pending = new
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    needs_attention = False  # a cache whose eviction policy scores tokens by attention sets this

    def new_positions(self, new: int) -> torch.Tensor:
        """Absolute positions (new,) of the pass's new tokens: ``position`` onwards."""
        return torch.arange(self.position, self.position + new, device=self.keys.device)

    def mask(self, new: int, rows: int) -> torch.Tensor:
        """Which of the ``rows`` held keys each new query may see, boolean (new, rows): the causal
        mask aligned to the end (the new tokens are the last ``new`` rows)."""
        return causal_mask(new, rows, self.keys.device)

    def score_bias(self, layer: int, rows: int) -> torch.Tensor | None:
        """An additive bias for ``layer``'s attention scores over the ``rows`` cached keys (None: no
        bias), broadcastable to (heads, new, rows): (rows,) the same for every query, (new, rows) one
        row per query of the pass (-inf hides a key from it), or (heads, 1, rows) one per query head.
        A plain cache adds none; lesson 06's caches use it."""
        return None

    def advance(self, attention: list[torch.Tensor] | None = None) -> None:
        """Called after a full forward pass: the appended rows now count in every layer.
        ``attention`` (per layer, (batch, heads, new, length)) is for caches that evict by it."""
        self.length += self._pending
        self.position += self._pending
        self._pending = 0

    def rewind(self, tokens: int) -> None:
        """Forget the last ``tokens`` positions (to run the same step again, e.g. when timing it)."""
        tokens = positive_int("tokens", tokens, allow_zero=True)
        if tokens > self.length:
            raise ValueError(f"cannot rewind {tokens} positions: the cache holds {self.length}")
        self.length -= tokens
        self.position -= tokens

    def nbytes(self) -> int:
        """Bytes of keys and values held (not the allocated capacity): 2 x layers x batch x kv_heads x length x head_dim x element size."""
        layers, batch, kv_heads, _, head_dim = self.keys.shape
        return 2 * layers * batch * kv_heads * self.length * head_dim * self.keys.element_size()

    def stored_bytes(self) -> int:
        """Bytes a real implementation of this cache holds; caches that store less than they keep
        here (lesson 06's int8 rows, shared layers) override it. A plain cache: ``nbytes()``."""
        return self.nbytes()


def rope_cos_sin(head_dim: int, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (len(positions), head_dim) for Llama's rotary embedding (halves convention)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (batch, heads, seq, head_dim): pairs are (i, i + head_dim/2), as in Hugging Face Llama."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def causal_mask(n_new: int, n_total: int, device=None) -> torch.Tensor:
    """Boolean (n_new, n_total): new token i, at absolute position n_total - n_new + i, sees keys 0 .. that position."""
    offset = n_total - n_new
    return torch.arange(n_total, device=device)[None, :] <= (torch.arange(n_new, device=device)[:, None] + offset)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (hidden), computed in float32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE: q_heads query heads share kv_heads K/V heads."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.q_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.q_heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, keep_weights: bool = False):
        """x (batch, new, hidden), cos and sin (new, head_dim) -> (output (batch, new, hidden), attention
        weights (batch, q_heads, new, positions) or None). With a cache, the new keys and values are
        appended to ``layer``'s and the queries attend over every position held."""
        c = self.c
        batch, n_new, _ = x.shape
        q = self.q_proj(x).view(batch, n_new, c.q_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, n_new, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, n_new, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # now every position so far
        group = c.q_heads // c.kv_heads  # query head h reads K/V head h // group
        # which keys each query sees: causal, offset to the absolute positions (the cache may say more)
        mask = cache.mask(n_new, k.shape[2]) if cache is not None else causal_mask(n_new, n_new, x.device)
        bias = cache.score_bias(layer, k.shape[2]) if cache is not None else None  # added to the scores, or None
        if keep_weights:  # spelled out, to hand back the weights
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (batch, heads, seq, head_dim)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
            if bias is not None:
                scores = scores + bias.to(scores.dtype)
            weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            out = weights @ v
        else:  # the same softmax(q k^T / sqrt(d) + mask) v, by PyTorch's fused kernel (about 4x faster here);
            # enable_gqa lets each group of query heads read its shared K/V head without copying the cache
            if bias is not None:
                mask = torch.where(mask, bias.to(q.dtype), torch.tensor(float("-inf"), dtype=q.dtype))
            weights, out = None, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=group > 1)
        out = out.transpose(1, 2).reshape(batch, n_new, c.q_heads * c.head_dim)
        return self.o_proj(out), weights


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); (batch, seq, hidden) -> (batch, seq, hidden)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One block: RMSNorm, attention and a residual; RMSNorm, SwiGLU and a residual."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, h, cos, sin, layer: int, cache: KVCache | None, keep_weights: bool = False):
        """h (batch, seq, hidden) -> (h after attention and MLP, each with its residual; attention
        weights or None): h + Attention(RMSNorm(h)), then h + SwiGLU(RMSNorm(h))."""
        attended, weights = self.self_attn(self.input_layernorm(h), cos, sin, layer, cache, keep_weights)
        h = h + attended
        return h + self.mlp(self.post_attention_layernorm(h)), weights


class LlamaModel(nn.Module):
    """The Hugging Face layout's ``model``: token embedding, the decoder layers, a final RMSNorm
    (``LlamaForCausalLM.forward`` runs them)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder with its output head. ``forward`` returns logits (batch, seq, vocab)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.attention_weights: list[torch.Tensor] | None = None

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None, keep_attention: bool = False):
        """Logits for ``input_ids`` (batch, seq). With a cache, the ids continue what it holds and
        their keys and values are appended. ``keep_attention`` stores each layer's attention weights
        (batch, heads, seq, positions) in ``self.attention_weights``."""
        c = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
        n_new = input_ids.shape[1]
        positions = cache.new_positions(n_new) if cache is not None else torch.arange(n_new)
        if int(positions.max()) >= c.max_positions:
            raise ValueError(f"positions {int(positions.min())}..{int(positions.max())} exceed max_positions {c.max_positions}")
        cos, sin = rope_cos_sin(c.head_dim, positions, c.rope_theta)
        cos, sin = cos.to(input_ids.device), sin.to(input_ids.device)
        h = self.model.embed_tokens(input_ids)
        kept = []
        keep_attention = keep_attention or (cache is not None and cache.needs_attention)
        for index, layer in enumerate(self.model.layers):
            h, weights = layer(h, cos, sin, index, cache, keep_attention)
            kept.append(weights)
        if cache is not None:
            cache.advance(kept if keep_attention else None)
        self.attention_weights = kept if keep_attention else None
        return self.lm_head(self.model.norm(h))


def load_hf_state_dict(model: LlamaForCausalLM, state_dict: dict) -> None:
    """Load weights in the Hugging Face Llama layout; rotary buffers (``inv_freq``) are ignored.

    Raises ValueError naming missing, unexpected or wrongly shaped tensors.
    """
    state = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
    if model.config.tie_embeddings:
        embed, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
        if head is not None and embed is not None and not torch.equal(head, embed):
            raise ValueError("the config ties the embeddings, but lm_head.weight differs from model.embed_tokens.weight")
        state.setdefault("lm_head.weight", embed)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(f"{k}: {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
                   for k in set(own) & set(state) if state[k].shape != own[k].shape)
    if missing or unexpected or wrong:
        raise ValueError("state dict does not fit this config: "
                         + "; ".join(part for part in (f"missing {missing}" if missing else "",
                                                       f"unexpected {unexpected}" if unexpected else "",
                                                       f"wrong shapes {wrong}" if wrong else "") if part))
    model.load_state_dict(state)


@torch.no_grad()
def decode_steps(model: LlamaForCausalLM, prompt_ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
                 temperature: float = 0.0, generator: torch.Generator | None = None, keep_attention: bool = False):
    """The decode loop: after each forward pass, yield (ids (batch, prompt + tokens so far), the last
    position's logits (batch, vocab), the cache or None). ``generate``, the step timer
    (``helpers.decode_timing``) and lesson 04's panel all run this loop.

    With ``use_cache`` the first pass (the prefill) feeds the whole prompt and fills a KVCache; each
    later pass feeds only the newest token. Without, every pass feeds the whole sequence so far.
    temperature 0 picks the most likely token; above 0 samples from softmax(logits / temperature).
    """
    if prompt_ids.ndim != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids must be (batch, prompt) with a prompt of at least one token, got {tuple(prompt_ids.shape)}")
    positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
    if temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    fed = prompt_ids.shape[1] + max(max_new_tokens - 1, 0)  # the last token made is never fed back
    if fed > model.config.max_positions:
        raise ValueError(f"prompt + new tokens - 1 = {fed} positions exceed max_positions {model.config.max_positions}")
    cache = KVCache(model.config, batch=prompt_ids.shape[0], capacity=fed,
                    dtype=next(model.parameters()).dtype, device=prompt_ids.device) if use_cache else None
    ids, step_input = prompt_ids, prompt_ids
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else ids, cache, keep_attention)[:, -1]
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = (logits.to(torch.float32) / temperature).softmax(dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
        yield ids, logits, cache


def generate(model: LlamaForCausalLM, prompt_ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 0.0, generator: torch.Generator | None = None,
             stop_token: int | None = None) -> torch.Tensor:
    """Continue ``prompt_ids`` (batch, prompt) by up to ``max_new_tokens`` tokens: (batch, prompt + new).

    Runs ``decode_steps`` (with the cache, or running the whole sequence again every step). With
    ``stop_token`` (such as a chat model's end-of-turn id) generation ends early once every
    sequence has produced it.
    """
    ids = prompt_ids
    for ids, _, _ in decode_steps(model, prompt_ids, max_new_tokens, use_cache, temperature, generator):
        if stop_token is not None and (ids[:, prompt_ids.shape[1]:] == stop_token).any(dim=1).all():
            break
    return ids


CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "checkpoints"


def load_course_model(directory: Path = CHECKPOINT_DIR) -> tuple[LlamaForCausalLM, dict]:
    """The course's trained model (``scripts/train_tiny_llama.py``) in eval mode, and its training summary."""
    summary_path, weights_path = Path(directory) / "tiny_llama.json", Path(directory) / "tiny_llama.pt"
    if not summary_path.exists() or not weights_path.exists():
        raise FileNotFoundError(f"no checkpoint in {directory}: run scripts/train_tiny_llama.py to make one")
    summary = json.loads(summary_path.read_text())
    model = LlamaForCausalLM(LlamaConfig(**summary["config"]))
    load_hf_state_dict(model, torch.load(weights_path, map_location="cpu", weights_only=True))
    return model.eval(), summary
