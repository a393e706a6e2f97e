"""Measure every eviction policy of lesson 06 on the course's model and held-out docstrings.

    python scripts/eviction_quality.py [--sequences 6] [--length 512]

For each policy and budget: mean loss (nats per byte) on held-out text fed one token at a time
through an EvictingCache, agreement of the next-token prediction with the full cache's, the
most bytes the cache held, and the time per step. Also where attention goes in the full-cache
model (the share on the first token, to look for attention sinks), and a controlled case where
a bias added to the first token's scores makes it a sink by construction. Writes
results/eviction_quality.json, which lesson 06 loads, with the positions each policy keeps
step by step on a 128-token sequence (for the lesson's panel). About 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.eviction import EvictingCache, evaluate, kept_history  # noqa: E402
from helpers.llama import load_course_model  # noqa: E402
from helpers.text_data import BOS, split, stdlib_docstrings, token_stream  # noqa: E402

BUDGETS = [32, 64, 128, 256]
SINK_BIAS = 8.0  # the controlled case: added to every score of the first token's key
POLICIES = ["window", "sinks", "heavy", "merge", "int8_old"]


def held_out_sequences(count: int, length: int) -> list[torch.Tensor]:
    """``count`` windows of ``length`` tokens of the held-out stream, each starting at a document's BOS."""
    stream = token_stream(split(stdlib_docstrings())[1])
    starts = (stream == BOS).nonzero().flatten().tolist()
    chosen, last = [], -length
    for s in starts:
        if s >= last + length and s + length <= len(stream):
            chosen.append(s)
            last = s
        if len(chosen) == count:
            break
    return [stream[s:s + length][None] for s in chosen]


@torch.no_grad()
def attention_on_first(model, sequences, skip: int = 64, sink_bias: float = 0.0) -> list[list[float]]:
    """Mean attention weight on position 0, per layer and head, over queries at positions >= skip
    (with ``sink_bias``, of the controlled model: the bias is added through a full EvictingCache)."""
    per_head = []
    for ids in sequences:
        cache = EvictingCache(model.config, "full", ids.shape[1], capacity=ids.shape[1], sink_bias=sink_bias) \
            if sink_bias else None
        model(ids, cache, keep_attention=True)
        per_head.append(torch.stack([w[0, :, skip:, 0].mean(dim=-1) for w in model.attention_weights]))
    return torch.stack(per_head).mean(0).tolist()


def _pack(history: torch.Tensor) -> list[str]:
    """One string per step: a digit per position (0 evicted or unseen, 1 held, 2 held in int8)."""
    return ["".join(str(int(v)) for v in row) for row in history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=6)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, summary = load_course_model()
    sequences = held_out_sequences(args.sequences, args.length)
    runs = [("full", args.length, False)] + [(p, b, False) for p in POLICIES for b in BUDGETS] \
        + [("window", b, True) for b in BUDGETS]
    results = []
    start = time.time()
    for policy, budget, compact in tqdm(runs, desc="policies x budgets", unit="run"):
        scores = [evaluate(model, ids, policy, budget, compact_positions=compact) for ids in sequences]
        results.append({"policy": policy + (" (positions compacted)" if compact else ""), "budget": budget,
                        **{k: sum(s[k] for s in scores) / len(scores) for k in scores[0]}})
    histories = {f"{policy} {budget}": _pack(kept_history(model, sequences[0][:, :129], policy, budget))
                 for policy in POLICIES for budget in (16, 32, 64)}
    controlled = []
    for policy, budget in tqdm([(p, b) for b in (32, 64) for p in ("window", "sinks")], desc="controlled sink", unit="run"):
        scores = [evaluate(model, ids, policy, budget, sink_bias=SINK_BIAS) for ids in sequences]
        controlled.append({"policy": policy, "budget": budget,
                           **{k: sum(s[k] for s in scores) / len(scores) for k in ("loss", "agreement")}})
    uniform = [sum(1 / (t + 1) for t in range(64, args.length)) / (args.length - 64)]
    out = {"model": summary["config"], "sequences": len(sequences), "length": args.length, "results": results,
           "attention_on_first_token": attention_on_first(model, sequences),
           "uniform_share_on_one_token": uniform[0], "kept_history_128": histories,
           "controlled_sink": {"sink_bias": SINK_BIAS, "attention_on_first_token": attention_on_first(
               model, sequences, sink_bias=SINK_BIAS), "results": controlled},
           "wall_seconds": round(time.time() - start)}
    path = ROOT / "results" / "eviction_quality.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} ({out['wall_seconds']} s)")


if __name__ == "__main__":
    main()
