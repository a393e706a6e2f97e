"""scripts/kv_quant_real.py: a short run writes the results lesson 02 loads, in the same layout
as the committed results/kv_quant_real.json."""

import json
from pathlib import Path

import pytest
from conftest import short_script_run

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "kv_quant_real.json"


def _layout(result: dict) -> dict:
    errors = result["layer_output_error"]
    return {"keys": sorted(result), "which": sorted(errors),
            "formats": {w: sorted(errors[w]) for w in errors},
            "granularities": {w: {f: sorted(errors[w][f]) for f in errors[w]} for w in errors},
            "layers": {len(v) for w in errors for f in errors[w] for v in errors[w][f].values()},
            "losses": sorted(result["loss_nats_per_token"])}


def test_committed_results_have_every_format_scale_and_split():
    result = json.loads(COMMITTED.read_text())
    layout = _layout(result)
    assert layout["which"] == ["keys", "values"] and layout["layers"] == {30}
    assert layout["formats"]["keys"] == ["e4m3", "e5m2", "int8"]
    assert layout["granularities"]["values"]["int8"] == ["channel", "tensor", "token"]
    assert "full" in layout["losses"] and "int8/channel/token" in layout["losses"] and "bf16/tensor/tensor" in layout["losses"]
    texts = len(result["texts"])
    assert texts >= 3 and all(len(v) == texts for v in result["loss_nats_per_token"].values())
    assert result["command"] == "python scripts/kv_quant_real.py"


@pytest.mark.slow
def test_a_short_run_writes_the_same_layout(tmp_path):
    short = short_script_run("kv_quant_real.py", tmp_path / "kv.json", "--tokens", "12")
    assert _layout(short) == _layout(json.loads(COMMITTED.read_text()))
    assert all(t["tokens"] == 12 for t in short["texts"]) and short["command"].endswith("--tokens 12")
