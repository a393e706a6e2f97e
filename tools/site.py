"""Build a static HTML site of the course from the stored notebook outputs.

    python -m tools.site [--out site]

Every lesson, exercise and solution notebook becomes one page (nbconvert's HTML exporter, "lab"
template), and ``index.html`` lists them in syllabus order. Links between notebooks point to
the pages. Plots are the stored PNG outputs, so they show without a kernel. Widget panels are
shown from the widget state saved with each notebook, drawn by the jupyter-widgets HTML manager;
they do not respond to their controls, which needs a live kernel (``make lab``). Each lesson page
says so at the top.

The site works offline: MathJax (formulas), the widget HTML manager and RequireJS (which the
manager needs) are served from the site's own ``_static/`` folder. They are taken from the npm
registry the first time a site is built (pinned versions, checked against the registry's SHA-512)
and kept in ``.cache/npm/``; set ``NPM_CONFIG_REGISTRY`` to use a mirror.

nbconvert is used because it renders saved widget state (Jupyter Book 2 does not yet), needs
no second toolchain, and is already installed with the course's Jupyter packages.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import io
import os
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
NOTE = ("> **Static copy.** This page shows the lesson with the outputs stored when it was last run. "
        "The plots are those outputs. The widget panels show their first view (drawn by the jupyter-widgets "
        "library, served with this site) and do not respond here: to move their controls, open the course "
        "in JupyterLab (`make lab`).")
TEMPLATES = Path(__file__).resolve().parent / "site_template"
CACHE = ROOT / ".cache" / "npm"

# (package, version, npm's SHA-512 integrity, files kept: paths inside the tarball's package/ folder,
# a trailing "/" for a whole folder). html-manager 1.0.x is the one that draws ipywidgets 8's state.
VENDORED = (
    ("mathjax", "3.2.2",
     "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
     ("es5/tex-chtml-full.js", "es5/output/chtml/fonts/woff-v2/")),
    ("@jupyter-widgets/html-manager", "1.0.7",
     "sha512-2xGwS7vVd2RGlKMiSqj1vYv2X59V73ygefUodhzy9Bho0mswWT/yo3Cg7MaYOqwozQjNo5k3rbJ3cETXWUwJ/g==",
     ("dist/",)),
    ("requirejs", "2.3.7",
     "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
     ("require.js",)),
)
# Where each script lies, relative to a page (pages sit one folder below the site's root).
MATHJAX = "../_static/mathjax/es5/tex-chtml-full.js"
WIDGETS = "../_static/@jupyter-widgets/html-manager/dist/embed-amd.js"
REQUIRE = "../_static/requirejs/require.js"


def _tarball(package: str, version: str, integrity: str) -> bytes:
    """The package's npm tarball, from the cache or the registry, checked against ``integrity``."""
    path = CACHE / f"{package.replace('/', '+')}-{version}.tgz"
    if path.exists():
        data = path.read_bytes()
    else:
        registry = os.environ.get("NPM_CONFIG_REGISTRY", "https://registry.npmjs.org").rstrip("/")
        url = f"{registry}/{package}/-/{package.split('/')[-1]}-{version}.tgz"
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as error:
            raise RuntimeError(f"could not download {package} {version} from {url} ({error}). The site serves it "
                               f"itself so that it works offline; it is needed once, then kept in {CACHE}.") from None
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != integrity:
        raise RuntimeError(f"{package} {version}: the tarball's SHA-512 is {digest}, expected {integrity}")
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return data


def vendor(static: Path) -> list[Path]:
    """Unpack the scripts the pages load into ``static`` (source maps left out); returns the files."""
    written = []
    for package, version, integrity, keep in VENDORED:
        with tarfile.open(fileobj=io.BytesIO(_tarball(package, version, integrity)), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("package/")
                wanted = any(name == k or (k.endswith("/") and name.startswith(k)) for k in keep)
                if not member.isfile() or not wanted or name.endswith(".map"):
                    continue
                target = static / package / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                written.append(target)
    return written


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "Untitled"


def _page(path: Path, exporter: HTMLExporter) -> tuple[str, str]:
    """(title, html) of one notebook, with notebook links turned into page links."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = re.sub(r"\]\(([^)\s]+?)\.ipynb\)", r"](\1.html)", cell.source)
    if path.parent.name == "notebooks":
        nb.cells.insert(1, nbformat.v4.new_markdown_cell(NOTE))
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": _title(nb)}})
    return _title(nb), body


def build(out: Path) -> list[Path]:
    """Write the site into ``out``; returns the pages written (index first)."""
    exporter = HTMLExporter(template_name="course", extra_template_basedirs=[str(TEMPLATES)],
                            mathjax_url=MATHJAX, widget_renderer_url=WIDGETS, require_js_url=REQUIRE)
    vendor(out / "_static")
    written, rows = [], {}
    for folder in FOLDERS:
        (out / folder).mkdir(parents=True, exist_ok=True)
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            title, body = _page(path, exporter)
            target = out / folder / f"{path.stem}.html"
            target.write_text(body, encoding="utf-8")
            written.append(target)
            rows.setdefault(path.stem, {})[folder] = (title, f"{folder}/{path.stem}.html")
    lines = [
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<title>How language models serve text fast: the KV cache and FlashAttention</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.5}"
        "td,th{padding:.3em .8em;text-align:left;border-bottom:1px solid #ddd}</style></head><body>",
        "<h1>How language models serve text fast: the KV cache and FlashAttention</h1>",
        "<p>An open course in Jupyter notebooks. These pages are static copies with their stored outputs; "
        "run the course in JupyterLab (<code>make lab</code>) to use the widgets and do the exercises.</p>",
        "<table><tr><th>#</th><th>Lesson</th><th>Exercises</th><th>Solutions</th></tr>",
    ]
    for stem, pages in sorted(rows.items()):
        title, link = pages.get("notebooks", (stem, "#"))
        cells = [f"<a href='{pages[f][1]}'>{f}</a>" if f in pages else "" for f in ("exercises", "solutions")]
        lines.append(f"<tr><td>{html.escape(stem[:2])}</td><td><a href='{link}'>{html.escape(title)}</a></td>"
                     f"<td>{cells[0]}</td><td>{cells[1]}</td></tr>")
    lines += ["</table></body></html>"]
    index = out / "index.html"
    index.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [index, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site")
    args = parser.parse_args(argv)
    pages = build(args.out)
    print(f"wrote {len(pages)} pages to {args.out} (open {args.out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
