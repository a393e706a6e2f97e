"""A small serving engine: continuous batching over a paged, prefix-cached KV cache.

The parts are the course's own: the decoder of lesson 04 (``helpers.llama``), lesson 05's block
allocator (here with prefix caching, ``helpers.prefix_cache``). What the engine adds is the loop
that serves many requests at once:

- **Iteration-level scheduling** (Orca, OSDI 2022): the batch is rebuilt at every step (one forward
  pass). A finished request leaves at once and a waiting one takes its place, instead of the whole
  batch waiting for its longest member (``policy="static"``, kept for comparison).
- **One pass, many lengths.** The step's tokens of every scheduled sequence are packed into one row
  (1, total tokens); each token carries its own position for RoPE; the keys and values are written
  into the sequences' blocks, read back through their block tables, and a mask lets each query see
  only its own sequence's earlier tokens (``PagedBatch``).
- **Prefill and decode are one thing.** A request's ``computed`` tokens have keys and values in the
  cache; a step feeds it its next ``n`` tokens. When it has been fed all its tokens, the last
  position's logits give the next token (greedy). A prompt fed in pieces under the step's token
  budget is **chunked prefill** (Sarathi); a decoding request is fed 1 token.
- **Prefix caching**: a new request first takes the cached blocks of its longest known prefix and
  is fed only the rest.
- **Preemption by recompute**: when a running request needs a block and none is left, the newest
  running request gives all its blocks back and waits at the head of the queue; later it is fed its
  prompt and its output so far again (its freed full blocks may still be cached, then it gets them
  back).

Times are recorded per step: wall-clock seconds and the step's index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from helpers.llama import LlamaForCausalLM
from helpers.prefix_cache import PrefixCachingAllocator
from helpers.units import positive_int


@dataclass
class Request:
    """One request: its prompt, how many tokens it may generate, and what happened to it."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # the step at which it joins the queue
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose keys and values are in the cache
    looked_up: int = 0  # tokens it held when admitted (over all its admissions: preempted ones come back)
    cached_tokens: int = 0  # of which the prefix cache served the keys and values
    preemptions: int = 0
    first_token_step: int | None = None
    finish_step: int | None = None
    token_times: list[float] = field(default_factory=list)  # wall clock (s from the run's start) of each output token
    arrival_time: float | None = None

    def __post_init__(self):
        if len(self.prompt) < 1:
            raise ValueError(f"request {self.rid!r}: the prompt must hold at least one token")
        positive_int("max_new_tokens", self.max_new_tokens)
        positive_int("arrival", self.arrival, allow_zero=True)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def pending(self) -> int:
        """Tokens still to feed before the next token comes out (the prompt's rest, or 1 when decoding)."""
        return len(self.tokens) - self.computed

    @property
    def done(self) -> bool:
        return self.finish_step is not None


def workload(prompts: list[list[int]], n: int, prefix: list[int] = (), share: float = 0.5,
             new_tokens: tuple[int, int] = (4, 48), mean_gap: float = 0.0, seed: int = 0) -> list[Request]:
    """``n`` seeded requests "r0", "r1", ...: each takes one of ``prompts`` (token ids) at random,
    starts with the shared ``prefix`` (a system prompt) with probability ``share``, may generate a
    number of tokens drawn uniformly from ``new_tokens`` (inclusive), and arrives ``mean_gap`` steps
    after the one before on average (exponential gaps, rounded down; 0: all wait at step 0)."""
    positive_int("n", n)
    if not prompts or any(len(p) < 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    if not 0 <= share <= 1 or mean_gap < 0:
        raise ValueError(f"share must be in [0, 1] and mean_gap >= 0, got {share} and {mean_gap}")
    low, high = new_tokens
    if not 1 <= low <= high:
        raise ValueError(f"new_tokens must be (low, high) with 1 <= low <= high, got {new_tokens}")
    rng = np.random.default_rng(seed)
    requests, clock = [], 0.0
    for i in range(n):
        prompt = list(prefix) * bool(rng.random() < share) + list(prompts[rng.integers(len(prompts))])
        requests.append(Request(f"r{i}", prompt, int(rng.integers(low, high + 1)), arrival=int(clock)))
        clock += rng.exponential(1.0) * mean_gap  # drawn even at 0, so the gap changes no other draw
    return requests


def packed_positions(spans: list[tuple[int, int]]) -> torch.Tensor:
    """Positions of a packed pass: for each sequence fed ``n`` tokens after ``start`` computed ones,
    start .. start + n - 1, one sequence after the other. (total tokens,)"""
    return torch.cat([torch.arange(start, start + n) for start, n in spans])


def packed_mask(spans: list[tuple[int, int]]) -> torch.Tensor:
    """Which keys each query of a packed pass sees, boolean (total new tokens, total rows): the rows
    are each sequence's start + n keys, sequence after sequence; a query sees its own sequence's
    keys up to its own position, and nothing of the others."""
    rows = sum(start + n for start, n in spans)
    mask = torch.zeros(sum(n for _, n in spans), rows, dtype=torch.bool)
    query, key = 0, 0
    for start, n in spans:
        own = torch.arange(start + n)
        mask[query:query + n, key:key + start + n] = own[None, :] <= (start + torch.arange(n))[:, None]
        query, key = query + n, key + start + n
    return mask


class PagedBatch:
    """The cache one packed forward pass sees (the protocol of ``helpers.llama.KVCache``).

    ``keys`` and ``values`` are the engine's pools, (layers, num_blocks, block_size, kv_heads,
    head_dim); ``tables`` and ``spans`` give, per scheduled sequence, its block table and
    (start, n): n new tokens after start computed ones. Token t of a sequence lives in slot
    t % block_size of block table[t // block_size].
    """

    needs_attention = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, tables: list[list[int]],
                 spans: list[tuple[int, int]]):
        self.keys, self.values, self.spans = keys, values, spans
        block_size = keys.shape[2]

        def slots(table, positions):  # flat slot of each position in the (num_blocks * block_size) view
            table = torch.as_tensor(table, dtype=torch.long)
            return table[positions // block_size] * block_size + positions % block_size

        self.write = torch.cat([slots(t, torch.arange(s, s + n)) for t, (s, n) in zip(tables, spans)])
        self.read = torch.cat([slots(t, torch.arange(s + n)) for t, (s, n) in zip(tables, spans)])
        self._positions, self._mask = packed_positions(spans), packed_mask(spans)

    def new_positions(self, new: int) -> torch.Tensor:
        return self._positions

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (1, kv_heads, new, head_dim) into their slots; return every scheduled sequence's
        keys and values read back through its block table, (1, kv_heads, rows, head_dim)."""
        out = []
        for pool, x in ((self.keys, k), (self.values, v)):
            flat = pool[layer].view(-1, *pool.shape[3:])  # (num_blocks * block_size, kv_heads, head_dim)
            flat[self.write] = x[0].transpose(0, 1).to(pool.dtype)
            out.append(flat[self.read].transpose(0, 1)[None])
        return out[0], out[1]

    def mask(self, new: int, rows: int) -> torch.Tensor:
        return self._mask

    def score_bias(self, layer: int, rows: int) -> None:
        return None

    def advance(self, attention=None) -> None:
        pass


@dataclass
class StepRecord:
    """What one step did: the scheduled (rid, tokens fed) pairs, the rids that got a token, blocks in
    use after it (and free ones still holding a cached prefix), the requests admitted in it with the
    tokens the prefix cache served each (rid, tokens), the requests preempted, its wall-clock seconds."""

    step: int
    fed: list[tuple[str, int]]
    produced: list[str]
    blocks_used: int
    blocks_cached_free: int
    admitted: list[tuple[str, int]]
    preempted: list[str]
    seconds: float

    @property
    def cache_hit_tokens(self) -> int:
        """Tokens the prefix cache served to the requests admitted in this step."""
        return sum(cached for _, cached in self.admitted)


class Engine:
    """Serve ``Request``s on ``model`` with a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Per step at most ``max_batch`` sequences and ``token_budget`` tokens are fed. ``policy``:
    "continuous" (requests join and leave at every step) or "static" (a batch is admitted only when
    the previous one has wholly finished). ``prefix_caching`` turns the hash lookup on or off.
    Generation of a request stops after ``max_new_tokens`` or at ``stop_token``.
    """

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int = 16, max_batch: int = 8,
                 token_budget: int = 256, policy: str = "continuous", prefix_caching: bool = True,
                 stop_token: int | None = None):
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        self.model, self.policy, self.prefix_caching, self.stop_token = model, policy, prefix_caching, stop_token
        self.max_batch = positive_int("max_batch", max_batch)
        self.token_budget = positive_int("token_budget", token_budget)
        self.blocks = PrefixCachingAllocator(num_blocks, block_size)
        c, param = model.config, next(model.parameters())
        shape = (c.layers, num_blocks, block_size, c.kv_heads, c.head_dim)
        self.keys = torch.zeros(shape, dtype=param.dtype, device=param.device)
        self.values = torch.zeros(shape, dtype=param.dtype, device=param.device)
        self.waiting: list[Request] = []  # in arrival order (a preempted request goes back to the front)
        self.running: list[Request] = []  # in admission order, oldest first
        self.pending: list[Request] = []  # not arrived yet
        self.finished: list[Request] = []
        self.timeline: list[StepRecord] = []
        self.step_index, self.clock = 0, 0.0

    # ---- requests ----------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        limit = self.model.config.max_positions
        if len(request.prompt) + request.max_new_tokens - 1 > limit:
            raise ValueError(f"request {request.rid!r}: prompt {len(request.prompt)} + {request.max_new_tokens} new "
                             f"tokens - 1 exceed the model's {limit} positions")
        if self.blocks.blocks_needed(len(request.prompt) + request.max_new_tokens - 1) > self.blocks.num_blocks:
            raise ValueError(f"request {request.rid!r} may need more than all {self.blocks.num_blocks} blocks")
        self.pending.append(request)

    def run(self, requests: list[Request]) -> list[Request]:
        """Serve ``requests`` to the end; returns them finished, in the order given."""
        for request in requests:
            self.add(request)
        while self.pending or self.waiting or self.running:
            self.step()
        return list(requests)

    # ---- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> tuple[list[tuple[Request, int]], list[Request], list[tuple[str, int]]]:
        """Choose this step's work: returns ([(request, tokens to feed)], preempted, [(rid admitted,
        tokens the prefix cache served it)]). Running requests first: those decoding (one token to
        feed) before those part-way through a prompt, each group oldest first, each fed its next
        chunk (blocks for it are taken here; if none are left, the newest running request not yet
        planned is preempted); then waiting requests in order, while the batch, the token budget and
        the free blocks allow."""
        budget, plan, preempted, admitted = self.token_budget, [], [], []
        for request in sorted(self.running, key=lambda r: r.pending > 1):  # decoding first; sorted() keeps the order within
            if budget == 0:
                break
            if request not in self.running:  # preempted for another request's block
                continue
            n = min(request.pending, budget)
            while not self._can_grow(request, n):
                planned = {r.rid for r, _ in plan}
                victim = next(r for r in reversed(self.running) if r.rid not in planned)  # at worst, itself
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            else:  # (runs when the loop ends without break: the blocks are there)
                self.blocks.append(request.rid, n)
                plan.append((request, n))
                budget -= n
        if preempted or (self.policy == "static" and self.running):
            # no one joins in a step that had to preempt (blocks are short), nor a static batch until it has finished
            return plan, preempted, admitted
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            request = self.waiting[0]
            hits = self.blocks.lookup(request.tokens, (len(request.tokens) - 1) // self.blocks.block_size) \
                if self.prefix_caching else []
            cached = len(hits) * self.blocks.block_size
            n = min(len(request.tokens) - cached, budget)
            # blocks it takes from the free list: its new ones, and cached ones no one is using
            taken = self.blocks.blocks_needed(cached + n) - sum(self.blocks.refcount[b] > 0 for b in hits)
            if taken > len(self.blocks.free):
                break  # first come, first served: no one overtakes the head of the queue
            self.waiting.pop(0)
            self.blocks.adopt(request.rid, hits)
            self.blocks.append(request.rid, n)
            request.computed = cached
            request.looked_up += len(request.tokens)
            request.cached_tokens += cached
            admitted.append((request.rid, cached))
            self.running.append(request)
            plan.append((request, n))
            budget -= n
        return plan, preempted, admitted

    def _can_grow(self, request: Request, n: int) -> bool:
        table = self.blocks.tables[request.rid]
        return self.blocks.blocks_needed(request.computed + n) - len(table) <= len(self.blocks.free)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.blocks.free_sequence(request.rid)
        request.computed = 0
        request.preemptions += 1
        self.waiting.insert(0, request)

    # ---- one step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> StepRecord | None:
        """Admit arrivals, schedule, run one packed forward pass, take each fed-up request's next token."""
        started = time.perf_counter()
        if not self.waiting and not self.running and self.pending:  # idle: skip ahead to the next arrival
            self.step_index = max(self.step_index, min(r.arrival for r in self.pending))
        for request in [r for r in self.pending if r.arrival <= self.step_index]:
            self.pending.remove(request)
            request.arrival_time = self.clock
            self.waiting.append(request)
        plan, preempted, admitted = self.schedule()
        if not plan:
            if self.waiting and not self.running:
                raise RuntimeError(f"request {self.waiting[0].rid!r} cannot be admitted: not enough free blocks")
            return None
        tables = [self.blocks.tables[r.rid] for r, _ in plan]
        spans = [(r.computed, n) for r, n in plan]
        ids = torch.tensor([t for r, n in plan for t in r.tokens[r.computed:r.computed + n]])[None]
        logits = self.model(ids.to(self.keys.device), PagedBatch(self.keys, self.values, tables, spans))[0]
        last = torch.cumsum(torch.tensor([n for _, n in plan]), 0) - 1
        produced = []
        seconds = time.perf_counter() - started
        self.clock += seconds
        for (request, n), row in zip(plan, last.tolist()):
            request.computed += n
            if self.prefix_caching:
                self.blocks.register(request.rid, request.tokens[:request.computed])
            if request.computed < len(request.tokens):
                continue  # part of a prompt: no token yet
            token = int(logits[row].argmax())
            request.output.append(token)
            request.token_times.append(self.clock)
            produced.append(request.rid)
            if request.first_token_step is None:
                request.first_token_step = self.step_index
            if len(request.output) == request.max_new_tokens or token == self.stop_token:
                request.finish_step = self.step_index
                self.running.remove(request)
                self.blocks.free_sequence(request.rid)
                self.finished.append(request)
        record = StepRecord(self.step_index, [(r.rid, n) for r, n in plan], produced, self.blocks.used_blocks,
                            self.blocks.evictable(), admitted, [r.rid for r in preempted], seconds)
        self.timeline.append(record)
        self.step_index += 1
        return record


def summary(requests: list[Request], timeline: list[StepRecord]) -> dict:
    """The run's figures: steps, seconds, output tokens per second and per step, mean time to first
    token (s and steps, from arrival), mean time per output token after the first (s), tokens
    served by the prefix cache at admission (and their share of all tokens held at admission),
    preemptions, most blocks in use."""
    if not requests or any(not r.done for r in requests):
        raise ValueError("summary needs finished requests")
    seconds = sum(s.seconds for s in timeline)
    out = sum(len(r.output) for r in requests)
    later = [r for r in requests if len(r.output) > 1]
    return {
        "steps": len(timeline),
        "seconds": seconds,
        "tokens_per_second": out / seconds,
        "tokens_per_step": out / len(timeline),
        "ttft_seconds": sum(r.token_times[0] - r.arrival_time for r in requests) / len(requests),
        "ttft_steps": sum(r.first_token_step - r.arrival + 1 for r in requests) / len(requests),
        "tpot_seconds": (sum((r.token_times[-1] - r.token_times[0]) / (len(r.output) - 1) for r in later) / len(later)
                         if later else float("nan")),
        "cached_prompt_tokens": sum(r.cached_tokens for r in requests),
        "cached_share": sum(r.cached_tokens for r in requests) / sum(r.looked_up for r in requests),
        "preemptions": sum(r.preemptions for r in requests),
        "max_blocks_used": max(s.blocks_used for s in timeline),
    }
