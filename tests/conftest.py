"""Shared test helpers: small random Llama models and token ids, seeded; short runs of the scripts;
pixels of panel figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.llama import LlamaConfig, LlamaForCausalLM


def small_config(layers: int = 2, max_positions: int = 128) -> LlamaConfig:
    """A Llama shape small enough for step-by-step tests: 4 query heads sharing 2 K/V heads of 8."""
    return LlamaConfig(layers=layers, hidden=32, q_heads=4, kv_heads=2, head_dim=8, intermediate=64,
                       max_positions=max_positions)


def random_llama(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """An untrained model of ``config`` with seeded weights, in eval mode."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def random_ids(n: int, seed: int) -> torch.Tensor:
    """(1, n) byte ids from a seeded generator."""
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def short_script_run(script: str, out: Path, *args: str, timeout: int = 600) -> dict:
    """Run ``scripts/<script>`` with ``args`` writing ``out``, on SmolLM2 (skipped without its
    package), and return the JSON it wrote."""
    pytest.importorskip("gguf")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(root / "scripts" / script), *args, "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=timeout)
    return json.loads(out.read_text())


def differing_pixels(fig_a, fig_b) -> int:
    """How many pixels differ between the PNGs of two figures (0: the same picture)."""
    import io

    import numpy as np
    from PIL import Image

    def pixels(fig):
        png = io.BytesIO()
        fig.savefig(png, format="png")
        return np.asarray(Image.open(png))

    a, b = pixels(fig_a), pixels(fig_b)
    if a.shape != b.shape:
        raise ValueError(f"the figures differ in size: {a.shape} and {b.shape}")
    return int((a != b).any(-1).sum())
