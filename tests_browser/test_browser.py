"""The course where students meet it: JupyterLab in a real browser, and the static site.

Run with ``make browser-test`` (it installs Playwright for Python and Debian's chromium first).
JupyterLab starts on a free local port; headless Chromium opens each lesson, runs all its
cells, and checks that no cell shows an error, that every widget panel renders as widgets (not
as text), that moving each panel's first slider changes its plot, and that quick presses on that
slider (where it has room for four or more) draw fewer plots than presses, the last one the last
value's. Screenshots of each panel go
to ``test-artifacts/browser/``. The static site is built and each page is opened from a local
HTTP server: it must load with the figures its notebook stores, and, with every request beyond
that server refused (as offline), render its formulas and draw its stored widget views.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
LESSONS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make browser-test`, which installs Debian's chromium")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield instance
        instance.close()


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab serving the course on a free port; yields its base URL."""
    port = _free_port()
    # Serve a copy of the lessons: JupyterLab saves notebooks it runs, and the tests must not touch the course.
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
               "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")
    settings = tmp_path_factory.mktemp("lab-settings")
    # Render every cell (JupyterLab otherwise renders only the cells in view) and skip the news prompt.
    for name, value in (("notebook-extension/tracker", '{"windowingMode": "none"}'),
                        ("apputils-extension/notification", '{"fetchNews": "false"}')):
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
    # The course kernel, pointing at this checkout's Python whatever is registered for the user.
    data = tmp_path_factory.mktemp("jupyter-data")
    kernel = data / "kernels" / "kv-course" / "kernel.json"
    kernel.parent.mkdir(parents=True)
    kernel.write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                  "display_name": "Python (KV course)", "language": "python"}))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTER_DATA_DIR": str(data),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("lab-workspaces"))}  # no tabs from earlier sessions
    server = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/status", 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _run_all_and_wait(page) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    # Every code cell shows a number once it has run ("[*]" while it waits or runs); an error stops the run.
    page.wait_for_function(
        """() => {
            if (document.querySelector(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"))
                return true;
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent);
            return prompts.length > 0 && prompts.every(t => /\\[\\d+\\]/.test(t));
        }""", timeout=180_000, polling=500)


def _last_image(panel) -> str:
    return panel.locator("img").last.get_attribute("src")


def _wait_for_new_image(panel, old: str) -> None:
    panel.page.wait_for_function(
        """([el, old]) => { const imgs = el.querySelectorAll('img');
                            return imgs.length && imgs[imgs.length - 1].getAttribute('src') !== old; }""",
        arg=[panel.element_handle(), old], timeout=30_000)


def _quick_moves_draw_the_latest_value(page, panel, handle, lesson: str, presses: int) -> None:
    """Presses a slider's key ``presses`` times, faster than the kernel redraws (each press a new
    value): the widgets' frontend sends a control's first new value at once and holds the rest,
    sending only the latest when the kernel is idle, so fewer plots than presses are drawn, and the
    last plot is the last value's (the same picture as moving away and back to it)."""
    panel.evaluate("""el => { const last = () => { const imgs = el.querySelectorAll('img');
                                                    return imgs.length ? imgs[imgs.length - 1].getAttribute('src') : null; };
        el._drawn = [last()];  // the picture showing now; the new ones follow it
        new MutationObserver(() => { const src = last();
            if (src && src !== el._drawn[el._drawn.length - 1]) el._drawn.push(src); })
          .observe(el, {childList: true, subtree: true, attributes: true}); }""")
    readout = panel.locator(".widget-readout").first
    start = readout.inner_text()
    for _ in range(presses):
        page.keyboard.press("ArrowLeft")
    for _ in range(2):  # idle after the last plot: the kernel may go idle between two of them
        page.get_by_text("Python (KV course) | Idle").wait_for(timeout=30_000)
        page.wait_for_timeout(1500)
    drawn = panel.evaluate("el => el._drawn")[1:]
    latest = _last_image(panel)
    assert readout.inner_text() != start and drawn and drawn[-1] == latest, f"{lesson}: {len(drawn)} new plots"
    assert len(drawn) < presses, f"{lesson}: {presses} quick presses drew {len(drawn)} plots, one per press"
    handle.focus()
    page.keyboard.press("ArrowRight")
    _wait_for_new_image(panel, latest)
    away = _last_image(panel)
    page.keyboard.press("ArrowLeft")
    _wait_for_new_image(panel, away)
    assert _last_image(panel) == latest, f"{lesson}: the last quick plot is not the last value's"


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs_in_jupyterlab_with_live_widgets(browser, lab, lesson):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab}/lab/tree/notebooks/{lesson}?reset")  # this notebook alone
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.get_by_text("Python (KV course) | Idle").wait_for(timeout=60_000)  # the course kernel has started
        _run_all_and_wait(page)
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        assert errors.count() == 0, f"{lesson}: a cell shows an error:\n{errors.first.inner_text()[:2000]}"
        page.wait_for_selector(".noUi-handle", timeout=60_000)
        text_outputs = " ".join(page.locator(".jp-OutputArea-output pre").all_inner_texts())
        assert "VBox(children" not in text_outputs and "interactive(children" not in text_outputs, \
            f"{lesson}: a widget panel rendered as text (is the JupyterLab widgets extension installed?)"
        panels = page.locator(".jp-CodeCell").filter(has=page.locator(".noUi-handle"))
        for n in range(panels.count()):  # every panel: its first slider moves its plot
            panel = panels.nth(n)
            panel.scroll_into_view_if_needed()
            panel.locator("img").first.wait_for(timeout=30_000)
            before = _last_image(panel)
            panel.screenshot(path=str(ARTIFACTS / f"{Path(lesson).stem}-{n}-before.png"))
            handle = panel.locator(".noUi-handle").first
            handle.focus()
            page.keyboard.press("End")
            _wait_for_new_image(panel, before)
            panel.screenshot(path=str(ARTIFACTS / f"{Path(lesson).stem}-{n}-after.png"))
            # quick presses where the slider has room for enough of them: each one a new value
            room = float(handle.get_attribute("aria-valuenow")) - float(handle.get_attribute("aria-valuemin"))
            if room >= 4:
                _quick_moves_draw_the_latest_value(page, panel, handle, f"{lesson} panel {n}", min(8, int(room)))
    finally:
        page.close()


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The static site, built and served over HTTP on a free port; yields its base URL."""
    from tools import site as site_builder

    out = tmp_path_factory.mktemp("site")
    site_builder.build(out)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _stored_pngs(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum(1 for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
               if "image/png" in o.get("data", {}) and base64.b64decode(o.data["image/png"])[:4] == b"\x89PNG")


def test_static_site_index_links_every_page(browser, site):
    page = browser.new_page()
    try:
        page.goto(f"{site}/index.html")
        links = page.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
        for folder in ("notebooks", "exercises", "solutions"):
            for path in sorted((ROOT / folder).glob("*.ipynb")):
                assert f"{folder}/{path.stem}.html" in links, f"the index does not link {folder}/{path.stem}"
        page.screenshot(path=str(ARTIFACTS / "site-index.png"))
    finally:
        page.close()


@pytest.mark.parametrize("lesson", LESSONS)
def test_static_site_lesson_page_shows_its_figures(browser, site, lesson):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    try:
        response = page.goto(f"{site}/notebooks/{Path(lesson).stem}.html", wait_until="load")
        assert response is not None and response.ok
        loaded = page.locator("img").evaluate_all("els => els.filter(e => e.complete && e.naturalWidth > 0).length")
        assert loaded >= _stored_pngs(ROOT / "notebooks" / lesson), f"{lesson}: some stored figures did not load"
        assert "Static copy." in page.content()
        page.screenshot(path=str(ARTIFACTS / f"site-{Path(lesson).stem}.png"))
    finally:
        page.close()


def _offline(page) -> list[str]:
    """Refuse every request that leaves the local site; returns the list of what was asked, which
    the caller checks (with a local server's failures, such as a missing script)."""
    problems: list[str] = []

    def route(route):
        if route.request.url.startswith(("http://127.0.0.1", "data:")):
            route.continue_()
        else:
            problems.append(f"left the site: {route.request.url}")
            route.abort()

    page.route("**/*", route)
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    return problems


def _wait(page, script: str, what: str, problems: list[str], arg=None) -> None:
    """Wait for ``script`` to hold; on timeout fail with ``what`` and the refused or failed requests."""
    try:
        page.wait_for_function(script, arg=arg, timeout=60_000)
    except PlaywrightTimeout:
        pytest.fail(f"{what} within 60 s; requests refused or failed: {problems or 'none'}")


@pytest.mark.parametrize("lesson", LESSONS)
def test_static_site_offline_renders_math_and_widgets(browser, site, lesson):
    stem = Path(lesson).stem
    nb = nbformat.read(ROOT / "notebooks" / lesson, as_version=4)
    views = sum(1 for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
                if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems = _offline(page)
    try:
        page.goto(f"{site}/notebooks/{stem}.html", wait_until="load")
        # MathJax has typeset the page: formulas are mjx-container elements, and no $...$ is left as text.
        has_math = any("$" in cell.source for cell in nb.cells if cell.cell_type == "markdown")
        _wait(page, "() => document.querySelectorAll('mjx-container').length > 0" if has_math
              else "() => window.MathJax && MathJax.startup", "MathJax typeset no formula" if has_math
              else "MathJax did not load", problems)
        page.evaluate("() => MathJax.startup.promise")  # typesetting has finished
        text = " ".join(page.locator(".jp-RenderedMarkdown").all_inner_texts())
        raw = re.findall(r"\$[^$\n]{1,80}\$", text)
        assert not raw, f"{stem}: formulas left as raw text: {raw[:5]}"
        errors = page.locator("mjx-merror").count()
        assert errors == 0, f"{stem}: {errors} formulas failed to typeset"
        # Each stored widget view is drawn by the site's own widget manager: controls appear in its place.
        _wait(page, "n => document.querySelectorAll('.widget-slider, .widget-dropdown, .widget-toggle-buttons')"
              ".length >= n", f"the {views} stored widget views were not drawn", problems, arg=views)
        page.screenshot(path=str(ARTIFACTS / f"site-offline-{stem}.png"), full_page=False)
        assert not problems, f"{stem}: " + "; ".join(problems[:5])
    finally:
        page.close()
