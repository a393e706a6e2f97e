"""scripts/train_tiny_llama.py: run with its defaults, it reproduces the committed checkpoint's settings."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("train_tiny_llama", ROOT / "scripts" / "train_tiny_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_the_committed_checkpoints_settings():
    script = _script()
    summary = json.loads((ROOT / "checkpoints" / "tiny_llama.json").read_text())
    defaults = vars(script.arguments().parse_args([]))
    assert {k: defaults[k] for k in summary["settings"]} == summary["settings"]
    assert script.CONFIG.to_dict() == summary["config"]
