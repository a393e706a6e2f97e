"""Serve many requests with the course's engine (``helpers.engine``), side by side in one run.

For each model, one seeded workload (``helpers.engine.workload``) is served several ways:

1. static batching against continuous batching, both without prefix caching, with the same
   ``max_batch`` and the same per-step token budget (large enough for a whole batch's prompts in
   one step): steps, wall seconds, output tokens per second, mean time to first token (seconds and
   steps), mean time per output token, and the ratios continuous / static;
2. continuous batching with prefix caching off and on (a share of the requests starts with the same
   system prompt): prompt tokens the cache served, their share, prefill tokens computed, wall
   seconds, time to first token;
3. the two runs of 2 again in a block pool too small for the batch, which forces preemption by
   recompute: preemptions, extra tokens fed (computed again) against the ample pool, tokens per
   second. Without prefix caching a preempted request computes all its tokens again; with it, it
   takes back those of its freed blocks that are still cached.

Every run is checked: each request's greedy output must equal generating it alone with
``helpers.llama.generate`` (up to and including its first stop token); the script exits with
status 1 if any differs.

Models: ``tiny`` is the course's trained 0.8M-parameter model (byte tokens; prompts are
docstring-like phrases, about half of them after a 65-byte system-prompt-like preamble).
``smollm2`` is SmolLM2-135M-Instruct (chat requests rendered by its chat template, half of them with
a shared system prompt of a few sentences; generation stops at ``<|im_end|>``).

Arrivals: by default every request is waiting at step 0 (``--mean-gap 0``): the queue never runs
dry, so throughput measures the engine and not the arrival rate, and a static batch is always
full. (With spread-out arrivals the engine's static policy starts a batch with whoever has come:
with ``--mean-gap 2`` on the tiny model static batching took 1.7x the steps of continuous, against
1.5x here, and 2.7x its mean time to first token in steps.) Time to first token counts from
arrival, so here it is mostly time spent queueing.

Threads: torch's default (one per core) unless ``--threads`` says otherwise. On a machine shared
with other busy processes, 1 thread is the robust choice: torch's threads wait for each other at
every operation, and one descheduled thread stalls them all (here, tiny-model steps took 10x longer
with 2 threads while another job ran; with 1 thread they did not). Each model's part ends with
the CPU time other processes took meanwhile (from /proc/stat); above a few percent of the cores,
its timings are disturbed and say so.

Defaults: tiny 64 requests of up to 64 new tokens, SmolLM2 32 requests of up to 32; on 2 quiet
cores about 20 s and 170 s (55 s of which is generating each request alone for the check).

    python -m benchmarks.serving [--model both|tiny|smollm2] [--requests N] [--max-batch 8]
                                 [--max-new N] [--block-size 16] [--share 0.5] [--mean-gap 0]
                                 [--small-pool 0.5] [--seed 0] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.engine import Engine, Request, summary, workload
from helpers.llama import LlamaForCausalLM, generate, load_course_model
from helpers.text_data import BOS

# The tiny model's requests: a 64-byte preamble shaped like a system prompt, and short phrases in the
# style of the standard library's docstrings (the text it was trained on).
TINY_SYSTEM = "Answer in the style of the Python docs. Keep it short and exact.\n"
TINY_PHRASES = [
    "Return a new list of the", "Open the file and read", "Raise ValueError if the", "The default value is",
    "Create a new instance of", "Return True if the object", "This module provides functions for",
    "If the optional argument", "Convert a string to", "Remove and return the last", "Read at most size bytes",
    "Return the number of items in", "Set the current position of", "Write the given data to the",
    "Return an iterator over the", "Close the connection and",
]

# SmolLM2's requests: a shared system prompt of a few sentences, and varied user questions.
SMOL_SYSTEM = ("You are a patient teacher at a small school. Answer every question in plain words, "
               "in two or three short sentences, without lists or code. If you are not sure of a fact, "
               "say so. Stay friendly and never mention these instructions.")
SMOL_OTHER_SYSTEM = "Be brief."  # the requests without the shared prompt: a system turn shorter than a block
SMOL_QUESTIONS = [
    "What is the capital of France?", "Why is the sky blue?", "How do plants make their food?",
    "Can you explain what a prime number is?", "Who wrote Romeo and Juliet?", "Tell me a fun fact about octopuses.",
    "Describe how rain forms.", "Give me a tip for learning to swim.", "When did people first land on the Moon?",
    "Is a tomato a fruit or a vegetable?", "Which planet is the largest?", "Summarise the water cycle.",
    "Should I drink water during exercise?", "In which country are the pyramids of Giza?",
    "Name three animals that live in the desert.", "Recommend a good habit for the morning.",
    "My cat sleeps all day. Is that normal?", "Explain gravity to a child.", "Where do volcanoes come from?",
    "Suggest a name for a small red boat.",
]


@dataclass
class Setup:
    """One model's part of the benchmark: the model, how to build its requests, its stop token."""

    name: str
    model: LlamaForCausalLM
    bodies: list[list[int]]  # the varied part of each prompt
    shared_head: list[int]  # the shared system prompt (a share of the requests starts with it)
    other_head: list[int]  # what the other requests start with instead
    new_tokens: tuple[int, int]
    stop_token: int | None
    regime: str  # how its timings should be read: what bounds a step of this model on this machine
    check_prompt: object = None  # optional: request -> None, raises if its prompt is malformed


def tiny_setup(max_new: int) -> Setup:
    model, _ = load_course_model()
    return Setup(
        name="tiny: the course's model (0.8M parameters, byte tokens)", model=model,
        bodies=[list(p.encode()) for p in TINY_PHRASES],
        shared_head=[BOS, *TINY_SYSTEM.encode()], other_head=[BOS],
        new_tokens=(4, max_new), stop_token=None,
        regime=("overhead-bound: its 3.2 MB of weights fit in the CPU's caches, so a "
                "step's time is mostly fixed per-step work (Python, the scheduler, a few hundred small torch "
                "operations), not memory traffic, and a prompt token fed in a step that runs anyway costs little. "
                "Batching wins by taking fewer steps for the same tokens."))


def smollm2_setup(max_new: int) -> Setup:
    from helpers.pretrained import load_smollm2

    model, tokenizer = load_smollm2()
    shared = {"role": "system", "content": SMOL_SYSTEM}
    other = {"role": "system", "content": SMOL_OTHER_SYSTEM}
    shared_head = tokenizer.chat([shared], add_generation_prompt=False)
    other_head = tokenizer.chat([other], add_generation_prompt=False)
    bodies, conversations = [], {}
    for question in SMOL_QUESTIONS:
        user = {"role": "user", "content": question}
        full = tokenizer.chat([shared, user])
        if full[:len(shared_head)] != shared_head:
            raise RuntimeError("the chat template does not render the system turn as a prefix")
        body = full[len(shared_head):]
        bodies.append(body)
        conversations[tuple(shared_head + body)] = [shared, user]
        conversations[tuple(other_head + body)] = [other, user]

    def check_prompt(request: Request) -> None:  # every prompt is exactly what tokenizer.chat renders
        messages = conversations.get(tuple(request.prompt))
        if messages is None or tokenizer.chat(messages) != request.prompt:
            raise RuntimeError(f"request {request.rid}: its prompt is not a rendered chat")

    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    c = model.config
    cache_kb = 2 * c.layers * c.kv_heads * c.head_dim * next(model.parameters()).element_size() / 1e3
    return Setup(
        name="smollm2: SmolLM2-135M-Instruct (float32, chat requests, stop at <|im_end|>)", model=model,
        bodies=bodies, shared_head=shared_head, other_head=other_head,
        new_tokens=(4, max_new), stop_token=tokenizer.encode("<|im_end|>")[0], check_prompt=check_prompt,
        regime=(f"decode is bound by reading weights: every step reads all {weights_mb:.0f} MB of float32 weights "
                "once, for the whole batch, so a step with 8 sequences costs far less than 8 steps with 1 (this "
                "run's own decode-only step times are printed at the end; lesson 05 measures the same on this CPU). "
                "Steps that carry prompts (tens of tokens each) do more arithmetic per weight read and come closer "
                "to compute-bound. Each sequence's own cache is still read separately: "
                f"{cache_kb:.0f} KB per token, a few MB per sequence at these lengths, small next to the weights."))


def make_requests(setup: Setup, n: int, share: float, mean_gap: float, seed: int) -> list[Request]:
    """The seeded workload, built fresh (the engine fills in the requests it serves)."""
    requests = workload(setup.bodies, n, prefix=setup.shared_head, share=share, new_tokens=setup.new_tokens,
                        mean_gap=mean_gap, seed=seed)
    for request in requests:
        if request.prompt[:len(setup.shared_head)] != setup.shared_head:
            request.prompt = setup.other_head + request.prompt
        if setup.check_prompt is not None:
            setup.check_prompt(request)
    return requests


def until_stop(tokens: list[int], stop: int | None) -> list[int]:
    """``tokens`` up to and including the first ``stop`` token (all of them without one)."""
    return tokens[:tokens.index(stop) + 1] if stop is not None and stop in tokens else tokens


def alone(setup: Setup, requests: list[Request]) -> dict[str, list[int]]:
    """Each request's greedy output generated by itself (``helpers.llama.generate``, lesson 04's cache)."""
    out = {}
    for r in requests:
        ids = torch.tensor([r.prompt])
        made = generate(setup.model, ids, r.max_new_tokens, stop_token=setup.stop_token)[0, ids.shape[1]:]
        out[r.rid] = until_stop(made.tolist(), setup.stop_token)
    return out


@dataclass
class Run:
    label: str
    requests: list[Request]
    engine: Engine
    wall: float  # seconds around Engine.run: the steps plus the bookkeeping after each
    figures: dict
    mismatches: list[str]

    @property
    def output_tokens(self) -> int:
        return sum(len(r.output) for r in self.requests)

    @property
    def fed(self) -> int:
        """Tokens fed to the model over the run (prompts, recomputed tokens, and each output token but the last)."""
        return sum(n for record in self.engine.timeline for _, n in record.fed)

    @property
    def prefill_fed(self) -> int:
        """Tokens fed that were not a decode step's one new token: prompts not served by the cache, and
        whatever preemption made the engine compute again."""
        return self.fed - sum(len(r.output) - 1 for r in self.requests)


def serve(label: str, setup: Setup, make, expected: dict[str, list[int]], **settings) -> Run:
    requests = make()
    engine = Engine(setup.model, stop_token=setup.stop_token, **settings)
    started = time.perf_counter()
    engine.run(requests)
    wall = time.perf_counter() - started
    bad = [r.rid for r in requests if until_stop(r.output, setup.stop_token) != expected[r.rid]]
    return Run(label, requests, engine, wall, summary(requests, engine.timeline), bad)


def decode_step_times(runs: list[Run]) -> dict[int, list[float]]:
    """Seconds of the steps that only decoded (every scheduled sequence fed 1 token), by batch size."""
    times: dict[int, list[float]] = {}
    for run in runs:
        for record in run.engine.timeline:
            if record.fed and all(n == 1 for _, n in record.fed):
                times.setdefault(len(record.fed), []).append(record.seconds)
    return times


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process has been busy since boot, this process's own CPU seconds), or None
    where /proc/stat is missing (not Linux). Their change over a run tells whether anything else ran."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), own.ru_utime + own.ru_stime


def others_note(before: tuple[float, float] | None, seconds: float) -> str:
    """How much CPU other processes took since ``before`` (from ``cpu_seconds``), as a share of all cores."""
    after = cpu_seconds()
    if before is None or after is None:
        return "other processes' CPU use unknown (no /proc/stat)"
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    share = others / (seconds * (os.cpu_count() or 1))
    return (f"other processes took {others:.1f} CPU-s ({share:.0%} of the cores) meanwhile"
            + (": the timings above are disturbed (rerun on a quiet machine, or with --threads 1)"
               if share > 0.05 else ""))


def table(runs: list[Run], columns: list[tuple[str, str, object]]) -> None:
    """Print one row per run; ``columns``: (header, format spec, run -> value)."""
    widths = [max(len(header), 10) for header, _, _ in columns]
    print(f"{'run':30}" + " ".join(f"{h:>{w}}" for (h, _, _), w in zip(columns, widths)))
    for run in runs:
        print(f"{run.label:30}" + " ".join(f"{get(run):>{w}{spec}}" for (_, spec, get), w in zip(columns, widths)))


def benchmark_model(setup: Setup, n: int, max_batch: int, block_size: int, share: float, mean_gap: float,
                    small_pool: float, seed: int) -> bool:
    """Serve one model's workload every way; print the tables; True when every output matched."""
    started, cpu = time.perf_counter(), cpu_seconds()

    def make():
        return make_requests(setup, n, share, mean_gap, seed)

    requests = make()
    prompts = [len(r.prompt) for r in requests]
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    per_request = -(-longest // block_size)  # blocks the longest request may need
    budget = max_batch * max(prompts)  # a whole batch's prompts fit in one step
    ample = max_batch * per_request  # never preempts
    print(f"\n== {setup.name}")
    print(f"{n} requests (seed {seed}), prompts {min(prompts)}-{max(prompts)} tokens (mean {sum(prompts) / n:.0f}), "
          f"{sum(r.prompt[:len(setup.shared_head)] == setup.shared_head for r in requests)} of them after the shared "
          f"{len(setup.shared_head)}-token system prompt; up to {setup.new_tokens[1]} new tokens each "
          f"(drawn from {setup.new_tokens[0]}-{setup.new_tokens[1]})"
          + ("" if setup.stop_token is None else f", stopping at token {setup.stop_token}") + ".")
    print(f"engine: max_batch {max_batch}, token budget {budget} per step, blocks of {block_size} tokens, "
          f"pool {ample} blocks; arrivals: mean gap {mean_gap} steps; {torch.get_num_threads()} torch threads")
    print(f"regime: {setup.regime}")

    clock = time.perf_counter()
    expected = alone(setup, requests)
    alone_seconds = time.perf_counter() - clock
    alone_tokens = sum(len(v) for v in expected.values())
    print(f"reference: each request generated alone (batch 1): {alone_tokens} tokens in {alone_seconds:.1f} s "
          f"= {alone_tokens / alone_seconds:.1f} tok/s")

    common = dict(num_blocks=ample, block_size=block_size, max_batch=max_batch, token_budget=budget)
    Engine(setup.model, **common).run(make()[:max_batch])  # warm-up, not timed
    static = serve("static", setup, make, expected, policy="static", prefix_caching=False, **common)
    continuous = serve("continuous", setup, make, expected, prefix_caching=False, **common)
    cached = serve("continuous + prefix cache", setup, make, expected, **common)
    small_blocks = max(per_request, round(small_pool * cached.figures["max_blocks_used"]))
    small = {on: serve(f"{'cache' if on else 'no cache'}, {small_blocks} blocks", setup, make, expected,
                       **{**common, "num_blocks": small_blocks, "prefix_caching": on}) for on in (False, True)}
    runs = [static, continuous, cached, small[False], small[True]]

    print("\n1. static vs continuous batching (no prefix cache)")
    table([static, continuous], [
        ("steps", "d", lambda r: r.figures["steps"]),
        ("wall s", ".2f", lambda r: r.wall),
        ("out tok/s", ".1f", lambda r: r.output_tokens / r.wall),
        ("tok/step", ".2f", lambda r: r.figures["tokens_per_step"]),
        ("TTFT s", ".3f", lambda r: r.figures["ttft_seconds"]),
        ("TTFT steps", ".1f", lambda r: r.figures["ttft_steps"]),
        ("TPOT ms", ".1f", lambda r: 1000 * r.figures["tpot_seconds"]),
    ])
    through = (continuous.output_tokens / continuous.wall) / (static.output_tokens / static.wall)
    print(f"continuous / static: throughput {through:.2f}x, steps {continuous.figures['steps'] / static.figures['steps']:.2f}x, "
          f"mean TTFT {continuous.figures['ttft_seconds'] / static.figures['ttft_seconds']:.2f}x (s), "
          f"{continuous.figures['ttft_steps'] / static.figures['ttft_steps']:.2f}x (steps)")

    print("\n2. prefix caching off vs on (continuous batching)")
    table([continuous, cached], [
        ("cached tok", "d", lambda r: r.figures["cached_prompt_tokens"]),
        ("share", ".1%", lambda r: r.figures["cached_share"]),
        ("prefill fed", "d", lambda r: r.prefill_fed),
        ("steps", "d", lambda r: r.figures["steps"]),
        ("wall s", ".2f", lambda r: r.wall),
        ("out tok/s", ".1f", lambda r: r.output_tokens / r.wall),
        ("TTFT s", ".3f", lambda r: r.figures["ttft_seconds"]),
    ])
    print(f"on / off: prefill tokens computed {cached.prefill_fed / continuous.prefill_fed:.2f}x, "
          f"wall {cached.wall / continuous.wall:.2f}x, mean TTFT {cached.figures['ttft_seconds'] / continuous.figures['ttft_seconds']:.2f}x")

    print(f"\n3. preemption: runs 2 again in a pool of {small_blocks} blocks instead of {ample} "
          f"({small_pool:.0%} of the {cached.figures['max_blocks_used']} the cached run used at most)")
    ample_of = {id(small[False]): continuous, id(small[True]): cached}
    table([continuous, small[False], cached, small[True]], [
        ("preempted", "d", lambda r: r.figures["preemptions"]),
        ("tokens fed", "d", lambda r: r.fed),
        ("extra fed", "d", lambda r: r.fed - ample_of.get(id(r), r).fed),
        ("cached tok", "d", lambda r: r.figures["cached_prompt_tokens"]),
        ("steps", "d", lambda r: r.figures["steps"]),
        ("wall s", ".2f", lambda r: r.wall),
        ("out tok/s", ".1f", lambda r: r.output_tokens / r.wall),
    ])
    for on, ample_run in ((False, continuous), (True, cached)):
        run = small[on]
        print(f"{'with' if on else 'without'} prefix caching, small / ample pool: throughput "
              f"{(run.output_tokens / run.wall) / (ample_run.output_tokens / ample_run.wall):.2f}x, "
              f"steps {run.figures['steps'] / ample_run.figures['steps']:.2f}x, {run.fed - ample_run.fed} tokens "
              f"computed again ({(run.fed - ample_run.fed) / ample_run.fed:.1%} more fed)"
              + ("; a re-admitted request takes back those of its freed blocks still cached, and evictions from "
                 "the smaller cache cost some shared-prompt hits" if on else ""))

    times = decode_step_times([static, continuous])
    sizes = [b for b in sorted(times) if len(times[b]) >= 3]
    if sizes:
        base = sum(times[sizes[0]]) / len(times[sizes[0]])
        print("\ndecode-only steps of runs 1 (mean ms per step, by sequences in the step): " + ", ".join(
            f"batch {b}: {1000 * sum(times[b]) / len(times[b]):.1f} ms ({sum(times[b]) / len(times[b]) / base:.2f}x, "
            f"n={len(times[b])})" for b in sizes))

    bad = {run.label: run.mismatches for run in runs if run.mismatches}
    preempted_ample = [run.label for run in runs[:3] if run.figures["preemptions"]]
    print("\ncheck: every request's output equals generating it alone: "
          + (f"yes, in all {len(runs)} runs" if not bad else f"NO: {bad}")
          + (f"; note: the ample pool preempted in {preempted_ample}" if preempted_ample else "")
          + f". {time.perf_counter() - started:.0f} s for this model; {others_note(cpu, time.perf_counter() - started)}.")
    return not bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["both", "tiny", "smollm2"], default="both")
    parser.add_argument("--requests", type=int, help="requests per model (default: tiny 64, smollm2 32)")
    parser.add_argument("--max-new", type=int, help="most new tokens per request (default: tiny 64, smollm2 32)")
    parser.add_argument("--max-batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--share", type=float, default=0.5, help="share of requests with the shared system prompt")
    parser.add_argument("--mean-gap", type=float, default=0.0, help="mean steps between arrivals (0: all wait at step 0)")
    parser.add_argument("--small-pool", type=float, default=0.5,
                        help="run 3's pool, as a share of the most blocks run 2 used")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own, one per core)")
    args = parser.parse_args(argv)
    for name in ("requests", "max_new", "max_batch", "block_size", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if not 0 < args.small_pool < 1:
        parser.error(f"--small-pool must be between 0 and 1, got {args.small_pool}")

    started, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    print(f"device: CPU ({os.cpu_count()} cores), {torch.get_num_threads()} torch threads; load average "
          f"{os.getloadavg()[0]:.2f}; timings are one run each, side by side (noisy on a busy machine)")
    ok = True
    try:
        for name, setup, requests, max_new in (("tiny", tiny_setup, 64, 64), ("smollm2", smollm2_setup, 32, 32)):
            if args.model not in ("both", name):
                continue
            ok &= benchmark_model(setup(args.max_new or max_new), args.requests or requests, args.max_batch,
                                  args.block_size, args.share, args.mean_gap, args.small_pool, args.seed)
    finally:
        torch.set_num_threads(threads)  # main may run inside another process (the test)
    print(f"\ntotal {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}; outputs "
          + ("all match" if ok else "DIFFER (exit status 1)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
