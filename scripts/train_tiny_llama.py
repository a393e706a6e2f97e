"""Train the course's small Llama-style model on the Python standard library's docstrings.

    python scripts/train_tiny_llama.py [--steps 2400] [--out checkpoints]

Byte-level (ids 0-255 plus BOS = 256 at the start of every docstring), documents packed into
sequences of 512 tokens, AdamW with a warm-up and a cosine decay, seeded. Writes
``tiny_llama.pt`` (the state dict in the Hugging Face Llama layout, float32) and
``tiny_llama.json`` (config, settings, the loss curve, held-out loss in nats per byte, versions,
wall time). Lessons 04 and 06 load that checkpoint; this script regenerates it.
The defaults are the settings of the committed checkpoint (a test keeps them in step); on 2 CPU
cores that run took 22 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from helpers.text_data import VOCAB_SIZE, split, stdlib_docstrings, token_stream  # noqa: E402

CONFIG = LlamaConfig(vocab_size=VOCAB_SIZE, layers=4, hidden=128, q_heads=4, kv_heads=2, head_dim=32,
                     intermediate=352, max_positions=512)


def batches(stream: torch.Tensor, seq_len: int, batch: int, generator: torch.Generator):
    """Endless random windows of seq_len + 1 tokens from the packed stream."""
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=generator)
        yield torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])


@torch.no_grad()
def held_out_loss(model, stream: torch.Tensor, seq_len: int) -> float:
    """Mean next-token loss (nats per token) over consecutive windows of the held-out stream."""
    model.eval()
    windows = stream[: (len(stream) - 1) // seq_len * seq_len + 1]
    losses, count = 0.0, 0
    for start in range(0, len(windows) - 1, seq_len * 8):
        chunk = [windows[s:s + seq_len + 1] for s in range(start, min(start + seq_len * 8, len(windows) - seq_len), seq_len)]
        x = torch.stack(chunk)
        logits = model(x[:, :-1])
        losses += F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    model.train()
    return losses / count


def arguments() -> argparse.ArgumentParser:
    """The command line; its defaults reproduce checkpoints/tiny_llama.pt."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "checkpoints")
    return parser


def main() -> None:
    args = arguments().parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    train_docs, held_docs = split(stdlib_docstrings())
    generator = torch.Generator().manual_seed(args.seed)
    train_stream = token_stream(train_docs, generator)
    held_stream = token_stream(held_docs)
    model = LlamaForCausalLM(CONFIG)
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 15)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    log = {"train_loss": [], "held_out_loss": []}
    start = time.time()
    data = batches(train_stream, args.seq_len, args.batch, generator)
    progress = tqdm(range(args.steps), desc="training", unit="step")
    for step in progress:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        x = next(data)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        log["train_loss"].append(round(loss.item(), 4))
        if (step + 1) % 250 == 0 or step + 1 == args.steps:
            held = held_out_loss(model, held_stream, args.seq_len)
            log["held_out_loss"].append([step + 1, round(held, 4)])
            progress.set_postfix(loss=f"{loss.item():.3f}", held_out=f"{held:.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "tiny_llama.pt")
    summary = {
        "config": CONFIG.to_dict(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
        "data": {"source": "Python standard library docstrings (helpers.text_data)", "train_documents": len(train_docs),
                 "held_out_documents": len(held_docs), "train_tokens": len(train_stream),
                 "held_out_tokens": len(held_stream)},
        "final_held_out_loss_nats_per_byte": log["held_out_loss"][-1][1],
        "wall_seconds": round(time.time() - start),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        **log,
    }
    (args.out / "tiny_llama.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"held-out loss {summary['final_held_out_loss_nats_per_byte']:.3f} nats/byte after {args.steps} steps, "
          f"{summary['wall_seconds']} s; wrote {args.out / 'tiny_llama.pt'}")


if __name__ == "__main__":
    main()
