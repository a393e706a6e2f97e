"""scripts/eviction_chunked.py: a short run writes the same layout as the committed results."""

import json
from pathlib import Path

import pytest
from conftest import short_script_run

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "eviction_chunked.json"


def _layout(quality: dict) -> dict:
    return {"keys": sorted(quality), "runs": sorted(quality["loss_nats_per_token"]),
            "along": sorted(quality["loss_along_position"]["mean_over_texts"]),
            "maps": sorted(quality["held_at_end_first_text"]["hex_bits"])}


def test_committed_results_cover_every_policy_budget_and_text():
    result = json.loads(COMMITTED.read_text())
    quality = result["quality"]
    texts = len(quality["texts"])
    assert texts >= 3 and all(t["tokens"] >= 2000 for t in quality["texts"])
    for policy in ("window", "heavy", "heavy_shared", "merge", "int8_old"):
        for budget in quality["budgets"]:
            assert len(quality["loss_nats_per_token"][f"{policy}/{budget}"]) == texts
    assert any(" from layer " in run for run in quality["loss_nats_per_token"])
    heads = len(quality["held_at_end_first_text"]["hex_bits"]["heavy/256"])
    assert heads == 30 * 3  # layers x K/V heads of SmolLM2
    assert quality["command"].startswith("python scripts/eviction_chunked.py")
    timing = result["timing"]
    assert set(timing["ms_median"]) == set(timing["ms_spread"]) == set(timing["ms_per_step_repeats"])
    assert all(len(r) == 5 for r in timing["ms_per_step_repeats"].values())


@pytest.mark.slow
def test_a_short_run_writes_the_same_layout(tmp_path):
    short = short_script_run("eviction_chunked.py", tmp_path / "ev.json", "--part", "quality", "--tokens", "40",
                             timeout=900)
    committed = json.loads(COMMITTED.read_text())
    assert _layout(short["quality"]) == _layout(committed["quality"])
    assert "timing" not in short  # a part run alone writes only its part
