"""Keeping the KV cache under a fixed budget: eviction and compression policies.

A policy decides, after each forward pass, what the cache keeps. The keep-masks are plain
functions of the cached tokens' positions (and, for heavy hitters, of the attention they have
received); ``EvictingCache`` applies a policy inside the lesson 04 decode loop.

Positions: keys are cached after rotary embedding, at the absolute position of their token, and
a new token gets its true absolute position (``KVCache.position``), however many tokens were
evicted before it. Relative distances between a query and the keys it still sees stay right.
(StreamingLLM instead caches keys before rotation and rotates them by their slot in the cache,
which keeps positions inside the trained range for endless streams.) ``compact_positions=True``
reproduces the mistake of numbering new tokens by the cache's length while old keys keep their
original rotation.

Policies:
- ``window``: the ``budget`` most recent tokens (a sliding window);
- ``sinks``: the first ``sinks`` tokens of the sequence plus the most recent ones (StreamingLLM);
- ``heavy``: the most recent half of the budget plus the tokens that have received the most
  attention so far (H2O's heavy hitters), attention summed over layers and heads;
- ``merge``: like ``sinks``, but a token leaving the window is merged (averaged) into the kept
  neighbour whose key is most similar, instead of being dropped;
- ``int8_old``: keeps every token, but stores keys and values older than the recent ``budget``
  tokens in int8 (one scale per token), a quarter of float32's bytes.
"""

from __future__ import annotations

import time

import torch

from helpers.kv_cache_size import positive_int
from helpers.llama import KVCache, LlamaConfig

POLICIES = ("full", "window", "sinks", "heavy", "merge", "int8_old")


# ---- keep-masks: which of n cached tokens a policy keeps --------------------------------------
def window_keep(n: int, budget: int) -> torch.Tensor:
    """Boolean (n,): the ``budget`` most recent of n tokens."""
    n, budget = positive_int("n", n, allow_zero=True), positive_int("budget", budget)
    return torch.arange(n) >= n - budget


def sinks_keep(n: int, budget: int, sinks: int = 4) -> torch.Tensor:
    """Boolean (n,): the first ``sinks`` tokens and the ``budget - sinks`` most recent ones."""
    sinks = positive_int("sinks", sinks, allow_zero=True)
    if positive_int("budget", budget) <= sinks:
        raise ValueError(f"budget ({budget}) must exceed sinks ({sinks}) to leave room for a window")
    return (torch.arange(n) < sinks) | window_keep(n, budget - sinks)


def heavy_keep(scores: torch.Tensor, budget: int, recent: int | None = None) -> torch.Tensor:
    """Boolean (n,): the ``recent`` most recent tokens (default: half the budget) plus the rest
    of the budget filled by the highest ``scores`` (attention received) among the older ones."""
    n, budget = scores.shape[0], positive_int("budget", budget)
    recent = budget // 2 if recent is None else positive_int("recent", recent, allow_zero=True)
    if recent > budget:
        raise ValueError(f"recent ({recent}) cannot exceed budget ({budget})")
    keep = window_keep(n, recent) if recent else torch.zeros(n, dtype=torch.bool)
    older = (~keep).nonzero().flatten()
    room = min(budget - int(keep.sum()), len(older))
    if room > 0:
        keep[older[scores[older].topk(room).indices]] = True
    return keep


# ---- a cache that applies a policy -------------------------------------------------------------
class EvictingCache(KVCache):
    """A KVCache that keeps at most ``budget`` tokens (``int8_old``: stores older ones in 8 bits).

    ``kept_positions`` lists the absolute position of every row held; ``scores`` the attention
    each row has received (summed over layers and heads), used by ``heavy``.
    """

    def __init__(self, config: LlamaConfig, policy: str, budget: int, capacity: int, sinks: int = 4,
                 compact_positions: bool = False, sink_bias: float = 0.0):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        budget = positive_int("budget", budget)
        super().__init__(config, batch=1, capacity=capacity)
        self.policy, self.budget, self.sinks = policy, budget, sinks
        if policy in ("sinks", "merge") and budget <= sinks:
            raise ValueError(f"budget ({budget}) must exceed sinks ({sinks}) to leave room for a window")
        self.compact_positions = compact_positions
        self.kept_positions = torch.zeros(0, dtype=torch.long)
        self.scores = torch.zeros(0)
        self.weights = torch.ones(0)  # tokens merged into each row (merge)
        self.quantized = torch.zeros(0, dtype=torch.bool)  # rows stored in int8 (int8_old)
        self.needs_attention = policy == "heavy"
        self.sink_bias = float(sink_bias)

    def score_bias(self, rows: int) -> torch.Tensor | None:
        """The controlled experiment of lesson 06: add ``sink_bias`` to every score of the key at
        absolute position 0 while it is held, making the first token a sink by construction."""
        if not self.sink_bias:
            return None
        new = rows - self.length
        positions = torch.cat([self.kept_positions[: self.length], torch.arange(self.position, self.position + new)])
        return torch.where(positions == 0, self.sink_bias, 0.0)

    def advance(self, attention: list[torch.Tensor] | None = None) -> None:
        new = self._pending
        first = self.position
        super().advance()
        self.kept_positions = torch.cat([self.kept_positions, torch.arange(first, first + new)])
        self.scores = torch.cat([self.scores, torch.zeros(new)])
        self.weights = torch.cat([self.weights, torch.ones(new)])
        self.quantized = torch.cat([self.quantized, torch.zeros(new, dtype=torch.bool)])
        if attention is not None:  # (batch, heads, new, length) per layer -> attention received per row
            self.scores += sum(w[0].sum(dim=(0, 1)) for w in attention)
        if self.policy == "int8_old":
            self._quantize_old()
        elif self.policy != "full" and self.length > self.budget:
            if self.policy == "merge":
                self._merge()
            else:
                self._keep(self._mask())
        if self.compact_positions:
            self.position = self.length  # the mistake: number the next token by the cache's length

    def _mask(self) -> torch.Tensor:
        if self.policy == "window":
            return window_keep(self.length, self.budget)
        if self.policy == "sinks":
            return sinks_keep(self.length, self.budget, self.sinks)
        return heavy_keep(self.scores, self.budget)

    def _keep(self, mask: torch.Tensor) -> None:
        index = mask.nonzero().flatten()
        n = len(index)
        self.keys[:, :, :, :n] = self.keys[:, :, :, index].clone()
        self.values[:, :, :, :n] = self.values[:, :, :, index].clone()
        for name in ("kept_positions", "scores", "weights", "quantized"):
            setattr(self, name, getattr(self, name)[index])
        self.length = n

    def _merge(self) -> None:
        """Merge the oldest row outside the sinks and the window into its most similar kept neighbour."""
        while self.length > self.budget:
            victim = self.sinks  # the oldest row that is neither a sink nor in the window
            neighbours = [i for i in (victim - 1, victim + 1) if self.sinks <= i < self.length]
            if not neighbours:
                self._keep(torch.arange(self.length) != victim)
                continue
            keys = self.keys[:, 0, :, : self.length]  # (layers, kv_heads, length, head_dim)
            similarity = [torch.cosine_similarity(keys[:, :, victim], keys[:, :, i], dim=-1).mean() for i in neighbours]
            target = neighbours[int(torch.stack(similarity).argmax())]
            w_v, w_t = self.weights[victim], self.weights[target]
            for store in (self.keys, self.values):
                store[:, :, :, target] = (w_v * store[:, :, :, victim] + w_t * store[:, :, :, target]) / (w_v + w_t)
            self.weights[target] = w_v + w_t
            self.scores[target] += self.scores[victim]
            self._keep(torch.arange(self.length) != victim)

    def _quantize_old(self) -> None:
        """Store rows older than the recent ``budget`` in int8, one scale per row (round trip)."""
        old = ~window_keep(self.length, self.budget) & ~self.quantized
        for i in old.nonzero().flatten().tolist():
            for store in (self.keys, self.values):
                rows = store[:, :, :, i]  # (layers, batch, kv_heads, head_dim)
                scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127
                store[:, :, :, i] = (rows / scale).round().clamp(-127, 127) * scale
        self.quantized |= old

    def stored_bytes(self) -> int:
        """Bytes held: float32 rows at 4 bytes per number, int8 rows at 1 (plus a 4-byte scale per row and head)."""
        layers, _, kv_heads, _, head_dim = self.keys.shape
        n_int8 = int(self.quantized[: self.length].sum())
        n_float = self.length - n_int8
        return 2 * layers * kv_heads * (n_float * head_dim * 4 + n_int8 * (head_dim + 4))


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, policy: str, budget: int, sinks: int = 4,
             compact_positions: bool = False, sink_bias: float = 0.0) -> dict:
    """Feed ``ids`` (1, n) one token at a time through an EvictingCache; compare each next-token
    prediction with the full cache's. Returns the mean loss (nats/token), the share of positions
    whose top prediction equals the full cache's, the most bytes held after a step (during a step
    one more token sits in the cache before the policy runs), and the wall seconds per step."""
    n = ids.shape[1]
    if sink_bias:  # the reference is the same biased model with every token kept
        reference = EvictingCache(model.config, "full", n, capacity=n, sink_bias=sink_bias)
        full_logits = torch.cat([model(ids[:, t:t + 1], reference)[0] for t in range(n)])
    else:
        full_logits = model(ids)[0]
    keeps_all = policy in ("full", "int8_old")
    cache = EvictingCache(model.config, policy, budget, capacity=n if keeps_all else min(n, budget) + 1,
                          sinks=sinks, compact_positions=compact_positions, sink_bias=sink_bias)
    logits, peak = [], 0
    start = time.perf_counter()
    for t in range(n - 1):
        logits.append(model(ids[:, t:t + 1], cache)[0, -1])
        peak = max(peak, cache.stored_bytes())
    seconds = (time.perf_counter() - start) / (n - 1)
    logits = torch.stack(logits)
    loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item()
    agree = (logits.argmax(-1) == full_logits[:-1].argmax(-1)).float().mean().item()
    return {"loss": loss, "agreement": agree, "peak_bytes": peak, "seconds_per_step": seconds}


@torch.no_grad()
def kept_history(model, ids: torch.Tensor, policy: str, budget: int, sinks: int = 4) -> torch.Tensor:
    """Feed ``ids`` (1, n) one token at a time through an EvictingCache and record, after each
    step t, which absolute positions 0..t the cache holds: int8 (n - 1, n), 0 = evicted or not yet
    seen, 1 = held, 2 = held in int8 (``int8_old``); merged rows count as held at their position."""
    n = ids.shape[1]
    keeps_all = policy in ("full", "int8_old")
    cache = EvictingCache(model.config, policy, budget, capacity=n if keeps_all else min(n, budget) + 1, sinks=sinks)
    history = torch.zeros(n - 1, n, dtype=torch.int8)
    for t in range(n - 1):
        model(ids[:, t:t + 1], cache)
        positions = cache.kept_positions[: cache.length]
        history[t, positions] = torch.where(cache.quantized[: cache.length], 2, 1).to(torch.int8)
    return history


# ---- static policies in one pass ----------------------------------------------------------------
STATIC_POLICIES = ("full", "window", "sinks")


def visible_keys(n: int, policy: str, budget: int, sinks: int = 4) -> torch.Tensor:
    """Boolean (n, n): which keys the query at each position sees when n tokens are fed one at a
    time through an ``EvictingCache`` with a static policy: what the cache kept after the previous
    step (the ``budget`` most recent tokens, or the first ``sinks`` plus the ``budget - sinks`` most
    recent), plus the token itself. These policies never look at the text, so the whole stream can
    be scored in one forward pass with this mask (``static_policy_losses``)."""
    if policy not in STATIC_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(STATIC_POLICIES)} (the others depend on attention "
                         f"or change stored values, so they need the step-by-step cache); got {policy!r}")
    query, key = torch.arange(positive_int("n", n))[:, None], torch.arange(n)[None, :]
    causal = key <= query
    if policy == "full":
        return causal
    budget = positive_int("budget", budget)
    if policy == "window":
        return causal & (key >= query - budget)
    if budget <= sinks:
        raise ValueError(f"budget ({budget}) must exceed sinks ({sinks}) to leave room for a window")
    return causal & ((key >= query - (budget - sinks)) | (key < sinks))


class MaskedCache(KVCache):
    """A KVCache that holds every token but lets each query see only the keys ``visible`` (n, n)
    allows, through the attention-score bias (-inf for the others)."""

    def __init__(self, config: LlamaConfig, visible: torch.Tensor):
        if visible.ndim != 2 or visible.shape[0] != visible.shape[1]:
            raise ValueError(f"visible must be a square (n, n) boolean mask; got shape {tuple(visible.shape)}")
        super().__init__(config, batch=1, capacity=visible.shape[0])
        self.visible = visible

    def score_bias(self, rows: int) -> torch.Tensor:
        queries = slice(self.position, self.position + self._pending)  # the tokens of this forward pass
        return torch.where(self.visible[queries, :rows], 0.0, float("-inf"))


@torch.no_grad()
def static_policy_losses(model, ids: torch.Tensor, policy: str, budget: int, sinks: int = 4) -> torch.Tensor:
    """Next-token loss (nats) at every position of ``ids`` (1, n), (n - 1,), under a static policy,
    from one forward pass: the same numbers ``evaluate`` gets one step at a time, to round-off."""
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, n), got shape {tuple(ids.shape)}")
    cache = MaskedCache(model.config, visible_keys(ids.shape[1], policy, budget, sinks))
    logits = model(ids, cache)[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
