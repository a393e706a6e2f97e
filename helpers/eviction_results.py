"""SmolLM2's eviction measurements, as the scripts stored them, and what lesson 06 reads off them.

``results/eviction_real.json`` (``scripts/eviction_real.py``): full cache, window and sinks, each
scored exactly in one pass, loss along the position and the attention on the first token.
``results/eviction_chunked.json`` (``scripts/eviction_chunked.py``): the policies that need the cache
step by step, 16 tokens per pass, with the positions each held at the end of the first text.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from helpers.eviction import EVICTING

RESULTS = Path(__file__).resolve().parents[1] / "results"
POLICIES = ("window", "sinks", "heavy", "heavy_shared", "merge", "int8_old")  # measured at every budget
BUDGETS = (64, 128, 256, 512)
EXACT = ("window", "sinks")  # scored exactly in one pass; the others ran in chunks


@lru_cache(maxsize=2)
def load_results(directory: Path = RESULTS) -> dict:
    """{"static": scripts/eviction_real.py's results, "chunked": scripts/eviction_chunked.py's}."""
    found = {}
    for key, name, script in (("static", "eviction_real.json", "scripts/eviction_real.py"),
                              ("chunked", "eviction_chunked.json", "scripts/eviction_chunked.py")):
        path = Path(directory) / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run python {script}")
        found[key] = json.loads(path.read_text())
    return found


def perplexity(results: dict, policy: str, budget: int | None = None) -> float:
    """Mean perplexity over the texts: exact for full, window and sinks, chunked for the others."""
    key = policy if budget is None else f"{policy}/{budget}"
    table = results["static"] if policy in EXACT + ("full",) else results["chunked"]["quality"]
    if key not in table["perplexity_mean"]:
        raise ValueError(f"no measurement for {key!r}; measured: {', '.join(table['perplexity_mean'])}")
    return table["perplexity_mean"][key]


def memory_share(results: dict, policy: str, budget: int | None = None) -> float:
    """The most cache a policy holds over a text, as a share of the full cache at the text's end:
    the budget for an evicting policy (what one-token-at-a-time decoding holds between steps),
    the measured peak for the others."""
    quality = results["chunked"]["quality"]
    n = quality["texts"][0]["tokens"]
    if policy in EVICTING:
        return budget / n
    key = policy if budget is None else f"{policy}/{budget}"
    return quality["peak_bytes"][key] / quality["peak_bytes"]["full"]


def held_map(results: dict, policy: str, budget: int) -> np.ndarray:
    """(layers x K/V heads, positions) ints for the first text once read: 0 not held, 1 held, 2 held in int8."""
    quality = results["chunked"]["quality"]
    n = quality["texts"][0]["tokens"]
    fed = n - 1  # every token but the last was fed to predict the next
    maps = quality["held_at_end_first_text"]["hex_bits"]
    if f"{policy}/{budget}" in maps:  # the policies that choose by the text: recorded
        hex_rows = maps[f"{policy}/{budget}"]
        bits = np.array([[int(c, 16) for c in row] for row in hex_rows], dtype=np.uint8)
        return np.unpackbits(bits[:, :, None], axis=2)[:, :, 4:].reshape(len(hex_rows), -1)[:, :n].astype(int)
    if policy not in POLICIES or budget not in BUDGETS:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)} and budget one of {BUDGETS}; "
                         f"got {policy!r}, {budget!r}")
    heads = len(next(iter(maps.values())))
    held = np.zeros(n, dtype=int)
    if policy == "window":
        held[fed - budget: fed] = 1
    elif policy == "sinks":
        held[: results["static"]["sinks"]] = 1
        held[fed - (budget - results["static"]["sinks"]): fed] = 1
    elif policy == "int8_old":
        group = quality["int8_group"]
        held[:fed] = 1
        held[: (fed - budget) // group * group] = 2
    return np.broadcast_to(held, (heads, n))
