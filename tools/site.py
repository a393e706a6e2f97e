"""Build a static HTML site of the course from the stored notebook outputs.

    python -m tools.site [--out site]

Every lesson, exercise and solution notebook becomes one page (nbconvert's HTML exporter, "lab"
template), and ``index.html`` lists them in syllabus order. Links between notebooks point to
the pages. Plots are the stored PNG outputs, so they show without a kernel. Widget panels are
shown from the widget state saved with each notebook: the page loads the jupyter-widgets HTML
manager from its CDN to draw them, and they do not respond to their controls, which needs a live
kernel (``make lab``). Each lesson page says so at the top.

nbconvert is used because it renders saved widget state (Jupyter Book 2 does not yet), needs
no second toolchain, and is already installed with the course's Jupyter packages.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
NOTE = ("> **Static copy.** This page shows the lesson with the outputs stored when it was last run. "
        "The plots are those outputs. The widget panels show their first view (drawn by the jupyter-widgets "
        "library, loaded from the web) and do not respond here: to move their controls, open the course in "
        "JupyterLab (`make lab`).")


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
    exporter = HTMLExporter(template_name="lab")
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
