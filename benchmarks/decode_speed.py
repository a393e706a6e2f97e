"""Decode with and without the KV cache, side by side in one run, on the course's model.

Generates the same greedy continuation both ways on the trained checkpoint's config (random
weights when the checkpoint is absent), and prints tokens per second of each and their ratio
at a few lengths. The device is chosen automatically: a CUDA GPU when one is present, else the CPU.

    python -m benchmarks.decode_speed [--lengths 64 128 256 480]
"""

from __future__ import annotations

import argparse

import torch

from helpers.decode_timing import scaling_exponent, step_seconds
from helpers.llama import LlamaConfig, LlamaForCausalLM, load_course_model
from helpers.text_data import encode


def load_model(device) -> tuple[LlamaForCausalLM, str]:
    try:
        model, _ = load_course_model()
        source = "trained checkpoint"
    except FileNotFoundError:
        torch.manual_seed(0)
        model, source = LlamaForCausalLM(LlamaConfig()).eval(), "random weights (no checkpoint found)"
    return model.to(device), source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 480])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, source = load_model(device)
    prompt = torch.tensor([encode("Return")], device=device)
    longest = max(args.lengths)
    step_seconds(model, prompt, 8, True)  # warm-up
    cached = step_seconds(model, prompt, longest, True).cumsum()
    uncached = step_seconds(model, prompt, longest, False).cumsum()
    print(f"device: {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}), model: {source}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"{'new tokens':>10} {'cached tok/s':>13} {'uncached tok/s':>15} {'speed-up':>9}")
    for n in args.lengths:
        print(f"{n:>10} {n / cached[n - 1]:>13,.0f} {n / uncached[n - 1]:>15,.0f} {uncached[n - 1] / cached[n - 1]:>8.1f}x")
    print(f"total time ~ n^k: k = {scaling_exponent(args.lengths, cached[[n - 1 for n in args.lengths]]):.2f} cached, "
          f"{scaling_exponent(args.lengths, uncached[[n - 1 for n in args.lengths]]):.2f} uncached")


if __name__ == "__main__":
    main()
