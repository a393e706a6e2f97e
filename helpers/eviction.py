"""Keeping the KV cache under a fixed budget: eviction and compression policies.

A policy decides, after each forward pass, what the cache keeps. The keep-masks are plain
functions of the cached tokens' positions (and, for heavy hitters, of the attention they have
received); ``EvictingCache`` applies a policy inside the lesson 04 decode loop, dropping rows for
real, separately in every layer and K/V head.

Positions: keys are cached after rotary embedding, at the absolute position of their token, and
a new token gets its true absolute position (``KVCache.position``), however many tokens were
evicted before it. Relative distances between a query and the keys it still sees stay right.
(StreamingLLM instead caches keys before rotation and rotates them by their slot in the cache,
which keeps positions inside the trained range for endless streams.) ``compact_positions=True``
reproduces the mistake of numbering new tokens by the cache's length while old keys keep their
original rotation.

Policies:
- ``window``: the most recent tokens (a sliding window);
- ``sinks``: the first ``sinks`` tokens of the sequence plus the most recent ones (StreamingLLM);
- ``heavy``: the most recent half of the budget plus the older tokens that have received the most
  attention so far, chosen in every layer and K/V head separately (H2O); with grouped-query
  attention a K/V head's score sums the attention of the query heads that read it;
- ``heavy_shared``: the same, but one choice for the whole model (attention summed over layers and heads);
- ``merge``: the first ``sinks`` tokens, a window, and ``memory`` slots: a token leaving the window
  fills a free slot, or is averaged into the slot whose key is most similar (cosine, in every layer
  and head); a slot standing for w tokens gets log(w) added to its attention score, as w copies of
  one key would;
- ``int8_old``: keeps every token, but stores tokens older than the recent ``budget`` in int8, in
  groups of ``group`` tokens: keys with one scale per channel and group, values one per token
  (KIVI's layout; lesson 02 measured why).
"""

from __future__ import annotations

import time

import torch

from helpers.kv_quant import stored
from helpers.llama import KVCache, LlamaConfig
from helpers.units import positive_int

POLICIES = ("full", "window", "sinks", "heavy", "heavy_shared", "merge", "int8_old")
EVICTING = ("window", "sinks", "heavy", "heavy_shared", "merge")  # the policies that drop rows


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
    """Boolean, the shape of ``scores`` (..., n): in every row (a layer and head, say), the
    ``recent`` most recent tokens (default: half the budget) plus the rest of the budget filled by
    the older tokens of highest score (attention received). Every row keeps min(n, budget) tokens."""
    n, budget = scores.shape[-1], positive_int("budget", budget)
    recent = budget // 2 if recent is None else positive_int("recent", recent, allow_zero=True)
    if recent > budget:
        raise ValueError(f"recent ({recent}) cannot exceed budget ({budget})")
    keep = (torch.arange(n) >= n - recent).expand(scores.shape).clone()  # the recent ones
    room = min(budget, n) - min(recent, n)
    if room > 0:
        older = scores.masked_fill(keep, float("-inf"))
        keep.scatter_(-1, older.topk(room, dim=-1).indices, True)
    return keep


# ---- a cache that applies a policy -------------------------------------------------------------
class EvictingCache(KVCache):
    """A KVCache (batch 1) that applies ``policy`` after every forward pass.

    Evicting policies hold ``budget - chunk + 1`` rows after a pass, so that when the tokens are
    fed ``chunk`` at a time no query sees more keys than one-at-a-time decoding would (the budget,
    plus itself); with ``chunk=1`` that is the budget. ``int8_old`` keeps every row, the most recent
    ``budget`` (and up to ``group - 1`` more) in full precision. Per layer and K/V head, in row
    order: ``positions`` the absolute position of each row (a merge slot: its first token),
    ``scores`` the attention it has received, ``counts`` the tokens it stands for.
    """

    def __init__(self, config: LlamaConfig, policy: str, budget: int, capacity: int, sinks: int = 4,
                 chunk: int = 1, memory: int | None = None, group: int = 32, compact_positions: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        super().__init__(config, batch=1, capacity=capacity)
        self.policy, self.budget = policy, positive_int("budget", budget)
        self.sinks, self.chunk = positive_int("sinks", sinks, allow_zero=True), positive_int("chunk", chunk)
        self.group = positive_int("group", group)
        self.keep_rows = self.budget - self.chunk + 1
        if policy in EVICTING and self.keep_rows < 1:
            raise ValueError(f"budget ({budget}) must be at least chunk ({chunk})")
        if policy in ("sinks", "merge") and self.keep_rows <= self.sinks:
            raise ValueError(f"budget ({budget}) must exceed sinks ({sinks}) + chunk ({chunk}) - 1 "
                             "to leave room for a window")
        self.memory = (self.keep_rows - self.sinks) // 2 if memory is None else positive_int("memory", memory, allow_zero=True)
        if policy == "merge" and self.sinks + self.memory >= self.keep_rows:
            raise ValueError(f"sinks ({sinks}) + memory ({self.memory}) leave no room for a window "
                             f"in {self.keep_rows} rows")
        self.compact_positions = compact_positions
        heads = (config.layers, config.kv_heads, 0)
        self.positions = torch.zeros(heads, dtype=torch.long)
        self.scores = torch.zeros(heads)
        self.counts = torch.ones(heads)
        self.slots = 0  # merge: memory slots in use (rows sinks .. sinks + slots - 1)
        self.quantized = 0  # int8_old: rows 0 .. quantized - 1 are stored in int8
        self.needs_attention = policy in ("heavy", "heavy_shared")

    def score_bias(self, layer: int, rows: int) -> torch.Tensor | None:
        """merge: log(tokens a slot stands for) on each held row, per query head (heads, 1, rows)."""
        if self.policy != "merge":
            return None
        held = self.counts[layer].log()  # (kv_heads, length)
        bias = torch.cat([held, held.new_zeros(held.shape[0], rows - self.length)], dim=1)
        group = self.config.q_heads // self.config.kv_heads
        return bias.repeat_interleave(group, dim=0)[:, None, :]

    def advance(self, attention: list[torch.Tensor] | None = None) -> None:
        new, first = self._pending, self.position
        super().advance()
        layers, kv_heads, _ = self.positions.shape
        self.positions = torch.cat([self.positions, torch.arange(first, first + new).expand(layers, kv_heads, new)], -1)
        self.scores = torch.cat([self.scores, torch.zeros(layers, kv_heads, new)], -1)
        self.counts = torch.cat([self.counts, torch.ones(layers, kv_heads, new)], -1)
        if attention is not None:  # (batch, heads, new, length) per layer -> attention received per row and K/V head
            received = torch.stack([w[0].sum(dim=1) for w in attention])  # (layers, heads, length)
            self.scores += received.view(layers, kv_heads, -1, self.length).sum(dim=2)
        if self.policy == "int8_old":
            self._quantize_old()
        elif self.policy == "merge":
            self._merge()
        elif self.policy != "full" and self.length > self.keep_rows:
            self._keep(self._mask())
        if self.compact_positions:
            self.position = self.length  # the mistake: number the next token by the cache's length

    def _mask(self) -> torch.Tensor:
        """Boolean (layers, kv_heads, length): the rows to keep, the same number in every head."""
        shape = self.positions.shape
        if self.policy == "window":
            return window_keep(self.length, self.keep_rows).expand(shape)
        if self.policy == "sinks":
            return sinks_keep(self.length, self.keep_rows, self.sinks).expand(shape)
        if self.policy == "heavy_shared":
            return heavy_keep(self.scores.sum(dim=(0, 1)), self.keep_rows).expand(shape)
        return heavy_keep(self.scores, self.keep_rows)

    def _keep(self, mask: torch.Tensor) -> None:
        """Hold only the rows ``mask`` (layers, kv_heads, length) marks, in order, per layer and head."""
        layers, kv_heads, n = mask.shape
        kept = int(mask[0, 0].sum())
        index = mask.nonzero()[:, 2].view(layers, kv_heads, kept)  # row-major: each head's rows in order
        rows = index[..., None].expand(-1, -1, -1, self.config.head_dim)
        for store in (self.keys, self.values):
            store[:, 0, :, :kept] = store[:, 0, :, :n].gather(2, rows)
        for name in ("positions", "scores", "counts"):
            setattr(self, name, getattr(self, name).gather(2, index))
        self.length = kept

    def _merge(self) -> None:
        """Rows: sinks | memory slots | window. Rows older than the window fill free slots, then
        each of the others is averaged into its most similar slot (per layer and head) and dropped."""
        window = self.keep_rows - self.sinks - self.memory
        leaving = self.length - self.sinks - self.slots - window
        if leaving <= 0:
            return
        filled = min(leaving, self.memory - self.slots)
        self.slots += filled  # rows right after the slots simply become slots
        leaving -= filled
        if leaving == 0:
            return
        slots = slice(self.sinks, self.sinks + self.slots)
        out = slice(slots.stop, slots.stop + leaving)
        if self.slots:  # with no memory slots the leaving rows are simply dropped
            unit = torch.nn.functional.normalize(self.keys[:, 0, :, : self.length], dim=-1)  # (layers, kv_heads, length, head_dim)
            target = (unit[:, :, out] @ unit[:, :, slots].transpose(-1, -2)).argmax(dim=-1)  # (layers, kv_heads, leaving)
            weight_in, weight_at = self.counts[:, :, out], self.counts[:, :, slots]
            weights = weight_at.scatter_add(2, target, weight_in)
            for store in (self.keys[:, 0], self.values[:, 0]):  # weighted averages, written in place
                total = store[:, :, slots] * weight_at[..., None]
                total.scatter_add_(2, target[..., None].expand(-1, -1, -1, store.shape[-1]),
                                   store[:, :, out] * weight_in[..., None])
                store[:, :, slots] = total / weights[..., None]
            self.counts[:, :, slots] = weights
            self.scores[:, :, slots] = self.scores[:, :, slots].scatter_add(2, target, self.scores[:, :, out])
        keep = torch.ones(self.length, dtype=torch.bool)
        keep[out] = False
        self._keep(keep.expand(self.positions.shape))

    def _quantize_old(self) -> None:
        """Store each complete group of ``group`` rows older than the recent ``budget`` in int8."""
        while self.length - self.budget - self.quantized >= self.group:
            rows = slice(self.quantized, self.quantized + self.group)
            self.keys[:, :, :, rows] = stored(self.keys[:, :, :, rows], "int8", "channel")  # scale per channel over the group
            self.values[:, :, :, rows] = stored(self.values[:, :, :, rows], "int8", "token")
            self.quantized += self.group

    def stored_bytes(self) -> int:
        """Bytes a real implementation holds: full-precision rows at the cache's element size; int8
        rows at 1 byte per number plus float32 scales (keys: one per channel and group; values: one
        per token); merge slots add a float32 count each. Per layer and K/V head, keys and values."""
        layers, _, kv_heads, _, head_dim = self.keys.shape
        full = self.length - self.quantized
        per_head = 2 * full * head_dim * self.keys.element_size()
        per_head += 2 * self.quantized * head_dim + 4 * (self.quantized // self.group * head_dim + self.quantized)
        if self.policy == "merge":
            per_head += 4 * self.length
        return layers * kv_heads * per_head


# ---- running a policy over a text ---------------------------------------------------------------
@torch.no_grad()
def chunked_losses(model, ids: torch.Tensor, cache: KVCache, chunk: int = 1) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Feed ``ids`` (1, n) through ``cache``, ``chunk`` tokens per forward pass. Returns the
    next-token loss (nats) at every position (n - 1,), the top prediction there (n - 1,), and the
    most bytes the cache held after a pass (``stored_bytes``)."""
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, n), got shape {tuple(ids.shape)}")
    n, chunk = ids.shape[1], positive_int("chunk", chunk)
    losses, top, peak = [], [], 0
    for start in range(0, n - 1, chunk):
        piece = ids[:, start: min(start + chunk, n - 1)]
        logits = model(piece, cache)[0].float()
        targets = ids[0, start + 1: start + 1 + piece.shape[1]]
        losses.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
        top.append(logits.argmax(-1))
        peak = max(peak, cache.stored_bytes())
    return torch.cat(losses), torch.cat(top), peak


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, policy: str, budget: int, chunk: int = 1, full_top: torch.Tensor | None = None,
             **cache_kwargs) -> dict:
    """Run ``policy`` over ``ids`` (1, n) with ``chunk`` tokens per pass and compare it with the full
    cache. Returns the mean loss (nats/token), the loss at every position, the share of positions
    whose top prediction equals the full cache's (``full_top``, (n - 1,), computed when not given),
    the most bytes held, and the wall seconds per token. Other keywords go to ``EvictingCache``."""
    n = ids.shape[1]
    if full_top is None:
        full_top = model(ids[:, :-1])[0].argmax(-1)
    capacity = n if policy in ("full", "int8_old") else budget + 1
    cache = EvictingCache(model.config, policy, budget, capacity=capacity, chunk=chunk, **cache_kwargs)
    start = time.perf_counter()
    losses, top, peak = chunked_losses(model, ids, cache, chunk)
    seconds = (time.perf_counter() - start) / (n - 1)
    return {"loss": float(losses.mean()), "losses": losses, "agreement": float((top == full_top).float().mean()),
            "peak_bytes": peak, "seconds_per_token": seconds}


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

    def score_bias(self, layer: int, rows: int) -> torch.Tensor:
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
