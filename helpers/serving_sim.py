"""A seeded serving workload, and how much KV memory each way of reserving it wastes.

Requests have a prompt and an output length drawn from log-normal distributions (clipped to
the context limit). A snapshot catches every request part-way through its output. Two ways to
hold their caches:

- contiguous: each request reserves room for the longest sequence it may reach (the context
  limit, as systems before paging did, since the output length is not known in advance);
- paged: each request holds ceil(tokens / block_size) blocks.

Waste is the share of reserved slots that hold no token. Parallel sampling (n answers to one
prompt) is compared with and without sharing the prompt's blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helpers.paged_kv import BlockAllocator
from helpers.units import positive_int


@dataclass(frozen=True)
class Request:
    prompt: int
    output: int  # tokens it will generate in total
    generated: int  # tokens generated so far (at the snapshot)

    @property
    def tokens(self) -> int:
        return self.prompt + self.generated


def workload(n: int = 200, max_context: int = 4096, seed: int = 0) -> list[Request]:
    """``n`` requests: prompts ~ lognormal around 300 tokens, outputs around 200, each caught at a
    uniformly random point of its output; prompt + output <= max_context."""
    if positive_int("max_context", max_context) < 8:
        raise ValueError(f"max_context must be at least 8 tokens, got {max_context}")
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(positive_int("n", n)):
        prompt = int(np.clip(rng.lognormal(np.log(300), 0.9), 4, max_context // 2))
        output = int(np.clip(rng.lognormal(np.log(200), 1.0), 1, max_context - prompt))
        requests.append(Request(prompt, output, int(rng.integers(1, output + 1))))
    return requests


def _check_requests(requests) -> None:
    if not requests:
        raise ValueError("requests must not be empty")


def contiguous_waste(requests: list[Request], reserve: int | None = None) -> float:
    """Share of slots wasted when every request reserves ``reserve`` slots up front, or, with
    ``reserve=None``, exactly its own final length (as if that were known in advance)."""
    _check_requests(requests)
    if reserve is None:
        reserved = sum(r.prompt + r.output for r in requests)
    else:
        reserve = positive_int("reserve", reserve)
        longest = max(r.tokens for r in requests)
        if reserve < longest:
            raise ValueError(f"reserve ({reserve}) is smaller than a request's {longest} tokens")
        reserved = reserve * len(requests)
    return 1 - sum(r.tokens for r in requests) / reserved


def paged_waste(requests: list[Request], block_size: int) -> float:
    """Share of slots wasted when every request holds whole blocks of ``block_size`` slots."""
    block_size = positive_int("block_size", block_size)
    _check_requests(requests)
    held = sum(math.ceil(r.tokens / block_size) * block_size for r in requests)
    return 1 - sum(r.tokens for r in requests) / held


def parallel_sampling_blocks(prompt: int, samples: int, generated: int, block_size: int) -> tuple[int, int]:
    """(blocks without sharing, blocks with the prompt shared by fork + copy-on-write), for
    ``samples`` answers of ``generated`` tokens each to one prompt, run on a real BlockAllocator."""
    prompt, samples = positive_int("prompt", prompt), positive_int("samples", samples)
    generated = positive_int("generated", generated)
    per_sequence = math.ceil((prompt + generated) / positive_int("block_size", block_size))
    unshared = samples * per_sequence
    allocator = BlockAllocator(num_blocks=unshared + 1, block_size=block_size)
    allocator.allocate("prompt", prompt)
    for i in range(samples):
        allocator.fork("prompt", f"sample {i}")
    allocator.free_sequence("prompt")  # only the samples keep it
    for i in range(samples):
        allocator.append(f"sample {i}", generated)
    allocator.check()
    return unshared, allocator.used_blocks
