"""scripts/eviction_real.py: a short run writes the same layout as the committed results."""

import json
from pathlib import Path

import pytest
from conftest import short_script_run

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "eviction_real.json"


def _layout(result: dict) -> dict:
    return {"keys": sorted(result), "losses": sorted(result["loss_nats_per_token"]),
            "along": sorted(result["loss_along_position"]["mean_over_texts"]),
            "attention": (len(result["first_token_attention"]["layers_x_heads"]),
                          len(result["first_token_attention"]["layers_x_heads"][0]))}


def test_committed_results_cover_every_policy_and_budget():
    result = json.loads(COMMITTED.read_text())
    assert _layout(result)["attention"] == (30, 9)
    for budget in result["budgets"]:
        assert f"window/{budget}" in result["loss_nats_per_token"] and f"sinks/{budget}" in result["loss_nats_per_token"]
    texts = len(result["texts"])
    assert texts >= 3 and all(t["tokens"] >= 2000 for t in result["texts"])
    assert all(len(v) == texts for v in result["loss_nats_per_token"].values())
    assert result["command"] == "python scripts/eviction_real.py"


@pytest.mark.slow
def test_a_short_run_writes_the_same_layout(tmp_path):
    short = short_script_run("eviction_real.py", tmp_path / "ev.json", "--tokens", "40")
    assert _layout(short) == _layout(json.loads(COMMITTED.read_text()))
