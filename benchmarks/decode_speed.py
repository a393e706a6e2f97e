"""Decode with and without the KV cache, side by side in one run: the course's model and SmolLM2.

1. The course's model (0.8M parameters): the same greedy continuation both ways, tokens per
   second of each and their ratio at a few lengths (random weights when the checkpoint is absent).
2. SmolLM2-135M-Instruct (134.5M parameters) after a chat prompt: tokens per second with and
   without the cache; float32 against bfloat16; batch 1 to 16; the bytes each decode step reads
   per second against this machine's measured memory bandwidth; and the course's loop against
   transformers' ``generate`` on the same weights (needs the reference extra: ``make benchmark``
   installs it).

Every figure is the best of ``--repeat`` runs. The device is a CUDA GPU when one is present, else
the CPU.

    python -m benchmarks.decode_speed [--lengths 64 128 256 480] [--new 32] [--batches 1 4 16] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from helpers.decode_timing import scaling_exponent, step_seconds
from helpers.llama import LlamaConfig, LlamaForCausalLM, generate, load_course_model
from helpers.measure import memory_bandwidth
from helpers.pretrained import load_smollm2
from helpers.step_cost import step_bytes
from helpers.text_data import encode


def load_model(device) -> tuple[LlamaForCausalLM, str]:
    try:
        model, _ = load_course_model()
        source = "trained checkpoint"
    except FileNotFoundError:
        torch.manual_seed(0)
        model, source = LlamaForCausalLM(LlamaConfig()).eval(), "random weights (no checkpoint found)"
    return model.to(device), source


def course_model(device, lengths: list[int]) -> None:
    model, source = load_model(device)
    prompt = torch.tensor([encode("Return")], device=device)
    longest = max(lengths)
    step_seconds(model, prompt, 8, True)  # warm-up
    cached = step_seconds(model, prompt, longest, True).cumsum()
    uncached = step_seconds(model, prompt, longest, False).cumsum()
    print(f"== the course's model: {source}, {sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"{'new tokens':>10} {'cached tok/s':>13} {'uncached tok/s':>15} {'speed-up':>9}")
    for n in lengths:
        print(f"{n:>10} {n / cached[n - 1]:>13,.0f} {n / uncached[n - 1]:>15,.0f} {uncached[n - 1] / cached[n - 1]:>8.1f}x")
    print(f"total time ~ n^k: k = {scaling_exponent(lengths, cached[[n - 1 for n in lengths]]):.2f} cached, "
          f"{scaling_exponent(lengths, uncached[[n - 1 for n in lengths]]):.2f} uncached")


def best_steps(model, prompt, new: int, use_cache: bool, repeat: int) -> np.ndarray:
    """Per-step seconds of the fastest of ``repeat`` generations (by total time)."""
    return min((step_seconds(model, prompt, new, use_cache) for _ in range(repeat)), key=np.sum)


def transformers_model(model: LlamaForCausalLM):
    """transformers' own LlamaForCausalLM holding the same weights, or None without the reference extra."""
    try:
        import transformers
    except ImportError:
        return None
    c = model.config
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden, intermediate_size=c.intermediate, num_hidden_layers=c.layers,
        num_attention_heads=c.q_heads, num_key_value_heads=c.kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_positions, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings, attn_implementation="sdpa")
    reference = transformers.LlamaForCausalLM(config).to(next(model.parameters()).dtype).eval()
    reference.load_state_dict(model.state_dict(), strict=False)
    return reference


def smollm2(device, new: int, batches: list[int], repeat: int) -> None:
    model, tokenizer = load_smollm2()
    model = model.to(device)
    shape = model.config.as_model_config("SmolLM2-135M")
    prompt = torch.tensor([tokenizer.chat([{"role": "user", "content": "Tell me about the history of Paris."}])],
                          device=device)
    bandwidth = memory_bandwidth() if device == "cpu" else None
    print(f"\n== SmolLM2-135M-Instruct: {shape.param_count():,} parameters, prompt {prompt.shape[1]} tokens, "
          f"{new} new tokens, best of {repeat}")
    if bandwidth:
        print(f"measured memory bandwidth (best of 5 sums of 256 MB): {bandwidth / 1e9:.1f} GB/s")
    mid = prompt.shape[1] + new // 2  # a typical position of the decode steps

    def report(label, steps, batch, bytes_per_element):
        decode = steps[1:]  # step 0 is the prefill
        per_step = float(np.mean(decode))
        read = step_bytes(shape, 1, mid, batch, weight_bytes_per_element=bytes_per_element,
                          cache_bytes_per_element=bytes_per_element)
        line = (f"{label:34} {batch * len(decode) / decode.sum():8.1f} tok/s  {1000 * per_step:7.1f} ms/step  "
                f"{read / per_step / 1e9:5.1f} GB/s read")
        if bandwidth:
            line += f" = {read / per_step / bandwidth:4.0%} of measured"
        print(line)
        return batch * len(decode) / decode.sum()

    step_seconds(model, prompt, 4, True)  # warm-up
    cached = report("float32, cache, batch 1", best_steps(model, prompt, new, True, repeat), 1, 4)
    uncached_steps = best_steps(model, prompt, new, False, repeat)
    uncached = (len(uncached_steps) - 1) / uncached_steps[1:].sum()
    print(f"{'float32, no cache, batch 1':34} {uncached:8.1f} tok/s  (the whole sequence each step) "
          f"-> the cache is {cached / uncached:.1f}x faster")
    half, _ = load_smollm2(torch.bfloat16)
    half = half.to(device)
    step_seconds(half, prompt, 4, True)
    bf16 = report("bfloat16, cache, batch 1", best_steps(half, prompt, new, True, repeat), 1, 2)
    print(f"{'':34} bfloat16 / float32 = {bf16 / cached:.2f}x the tokens per second")
    for batch in batches:
        if batch == 1:
            continue
        rate = report(f"float32, cache, batch {batch}", best_steps(model, prompt.repeat(batch, 1), new, True, repeat),
                      batch, 4)
        print(f"{'':34} {rate / cached:.1f}x batch 1's tokens per second")

    reference = transformers_model(model)
    if reference is None:
        print("transformers is not installed (the reference extra): no comparison with its generate")
        return
    ours_best = theirs_best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        ours = generate(model, prompt, new)
        ours_best = min(ours_best, time.perf_counter() - start)
        start = time.perf_counter()
        with torch.no_grad():
            theirs = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                        min_new_tokens=new, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        theirs_best = min(theirs_best, time.perf_counter() - start)
    print(f"course's generate: {ours_best:.2f} s; transformers' generate on the same weights: {theirs_best:.2f} s "
          f"-> ratio {ours_best / theirs_best:.2f} (course / transformers); same tokens: {torch.equal(ours, theirs)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 480])
    parser.add_argument("--new", type=int, default=32, help="tokens SmolLM2 generates per run")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}), "
          f"{torch.get_num_threads()} threads")
    course_model(device, args.lengths)
    smollm2(device, args.new, args.batches, args.repeat)


if __name__ == "__main__":
    main()
