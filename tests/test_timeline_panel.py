"""The lesson 07 panel: real engine runs of the course model drawn as requests x steps; the
cells follow the step records; a step move only moves the cursor and rewrites the caption."""


import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import differing_pixels

from helpers.engine import Engine, Request, StepRecord, summary, workload
from helpers.llama import load_course_model
from helpers.panels import output as panel_output
from helpers.panels import timeline as panel
from helpers.text_data import encode

PREFIX = encode("Return a new list of the items in the sequence. ")
PROMPTS = [encode(t) for t in ("Open the file", "Create a new", "The default value is", "Raise ValueError if")]
SETTINGS = {  # the longest run first: switching to the others clamps the slider
    "static": dict(policy="static", prefix_caching=False),
    "continuous": dict(prefix_caching=False),
    "continuous + prefix cache": dict(),
    "small pool": dict(num_blocks=14, token_budget=16),  # preempts
}
POOLS = {name: SETTINGS[name].get("num_blocks", 48) for name in SETTINGS}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def runs():
    model = load_course_model()[0]
    out = {}
    for name, settings in SETTINGS.items():
        requests = workload(PROMPTS, 8, prefix=PREFIX, share=0.6, new_tokens=(2, 12), mean_gap=1.0, seed=0)
        engine = Engine(model, **{"num_blocks": 48, "block_size": 8, "max_batch": 3, "token_budget": 32, **settings})
        out[name] = (engine.run(requests), engine.timeline)
    figures = {name: summary(*run) for name, run in out.items()}
    assert figures["small pool"]["preemptions"] > 0
    assert figures["continuous + prefix cache"]["cached_prompt_tokens"] > 0
    assert figures["continuous"]["steps"] < figures["static"]["steps"]
    return out


def _expected_cell(request, step, records):
    record = records.get(step)
    fed = record is not None and any(rid == request.rid for rid, _ in record.fed)
    if record is not None and request.rid in record.produced:
        return panel.TOKEN
    if fed:
        return panel.PREFILL
    if request.arrival <= step <= request.finish_step:
        return panel.WAITING
    return panel.ABSENT


@pytest.mark.parametrize("name", SETTINGS)
def test_cells_follow_the_step_records(runs, name):
    requests, timeline = runs[name]
    cells = panel.timeline_cells(requests, timeline)
    records = {s.step: s for s in timeline}
    assert cells.shape == (len(requests), timeline[-1].step + 1)
    for i, request in enumerate(requests):
        for step in range(cells.shape[1]):
            assert cells[i, step] == _expected_cell(request, step, records), (name, request.rid, step)
        produced = [s.step for s in timeline if request.rid in s.produced]
        assert np.flatnonzero(cells[i] == panel.TOKEN).tolist() == produced
        assert len(produced) == len(request.output)
    if name == "small pool":  # a chunked prompt: fed, no token
        assert (cells == panel.PREFILL).sum() > 0


def test_figure_image_markers_and_pool(runs):
    requests, timeline = runs["small pool"]
    fig = panel.draw_timeline(runs, "small pool", 0, POOLS)
    top, bottom, right = fig.axes
    assert np.array_equal(np.asarray(top.images[0].get_array()), panel.timeline_cells(requests, timeline))
    rows = {r.rid: i for i, r in enumerate(requests)}
    crosses, stars = top.lines
    assert list(zip(crosses.get_xdata(), crosses.get_ydata())) == [(s.step, rows[rid]) for s in timeline
                                                                   for rid in s.preempted]
    assert list(zip(stars.get_xdata(), stars.get_ydata())) == [(s.step, rows[rid]) for s in timeline
                                                               for rid, cached in s.admitted if cached]
    (pool,) = [line for line in bottom.lines if line.get_linestyle() == "--"]
    assert list(pool.get_ydata()) == [14, 14]
    (hits,) = right.lines
    assert list(hits.get_xdata()) == [s.step for s in timeline if s.cache_hit_tokens]
    assert list(hits.get_ydata()) == [s.cache_hit_tokens for s in timeline if s.cache_hit_tokens]
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert legend[1:] == [label for label, _ in list(panel.STATES.values())[1:]] + [
        "preempted", "admitted with prefix-cache hits"]
    assert "small pool: 8 requests" in top.get_title(loc="left") and "1 preemption," in top.get_title(loc="left")


@pytest.mark.parametrize("name", ["continuous + prefix cache", "small pool"])
def test_the_records_account_for_every_admission_and_cached_token(runs, name):
    requests, timeline = runs[name]
    for r in requests:
        admitted = [cached for s in timeline for rid, cached in s.admitted if rid == r.rid]
        assert len(admitted) == r.preemptions + 1
        assert sum(admitted) == r.cached_tokens


def test_caption_names_the_step_work(runs):
    requests, timeline = runs["small pool"]
    (record,) = [s for s in timeline if s.preempted]
    fig = panel.draw_timeline(runs, "small pool", record.step, POOLS)
    (caption,) = [t for t in fig.texts if t.get_gid() == "caption"]
    text = caption.get_text()
    assert text.startswith(f"step {record.step}, tokens fed: ")
    for rid, n in record.fed:
        assert f"{rid} {n} ({'token' if rid in record.produced else 'prefill'})" in text
    assert f"{record.blocks_used} of 14 blocks in use" in text
    assert f"preempted {', '.join(record.preempted)}" in text
    cursors = [p for p in fig.artists if p.get_gid() == "cursor"]
    assert len(cursors) == 2 and all(c.get_x() == record.step - 0.5 for c in cursors)


def test_idle_steps_have_no_record_and_say_so():
    requests = [Request("a", [1, 2, 3], 2, arrival=0), Request("b", [4, 5], 1, arrival=5)]
    timeline = [StepRecord(0, [("a", 3)], ["a"], 1, 0, [], [], 0.0), StepRecord(1, [("a", 1)], ["a"], 1, 0, [], [], 0.0),
                StepRecord(5, [("b", 2)], ["b"], 1, 1, [], [], 0.0)]
    requests[0].finish_step, requests[1].finish_step = 1, 5
    cells = panel.timeline_cells(requests, timeline)
    assert cells.tolist() == [[3, 3, 0, 0, 0, 0], [0, 0, 0, 0, 0, 3]]
    view = panel.TimelineView({"gap": (requests, timeline)}, "gap")
    assert view.describe(3).startswith("step 3: idle")
    assert "1 blocks in use" in view.describe(5) and " of " not in view.describe(5)  # no pool given


def test_a_step_move_updates_the_same_figure_in_place(runs, monkeypatch):
    shown, figures = [], []
    monkeypatch.setattr(panel_output, "display", shown.append)
    real = panel_output.show_figure
    monkeypatch.setattr(panel_output, "show_figure", lambda fig: figures.append(fig) or real(fig))
    box = panel.timeline_panel(runs, POOLS)
    (run, step), out = box.children[0].children, box.children[1]
    assert run.options == tuple(SETTINGS) and run.value == "static" and type(out).__name__ == "Output"
    assert step.max == runs["static"][1][-1].step and step.value == 0
    assert len(shown) == 1 and shown[0].data.startswith(b"\x89PNG")
    fig = figures[0]
    image = fig.axes[0].images[0]
    (caption,) = [t for t in fig.texts if t.get_gid() == "caption"]
    cursors = [p for p in fig.artists if p.get_gid() == "cursor"]
    before = caption.get_text()
    for value in (7, 30, 7):
        step.value = value
        assert figures[-1] is fig and fig.axes[0].images[0] is image
        assert all(c.get_x() == value - 0.5 for c in cursors)
        assert caption.get_text().startswith(f"step {value}, ")
    assert caption.get_text() != before
    assert len(shown) == 4 and len(set(map(id, figures))) == 1
    assert not plt.get_fignums()  # shown, then closed out of pyplot: nothing piles up
    # the frozen axes paste the same pixels as a figure drawn from scratch
    assert differing_pixels(fig, panel.draw_timeline(runs, "static", 7, POOLS)) == 0


def test_the_dropdown_switches_runs_and_clamps_the_slider(runs, monkeypatch):
    shown, figures = [], []
    monkeypatch.setattr(panel_output, "display", shown.append)
    real = panel_output.show_figure
    monkeypatch.setattr(panel_output, "show_figure", lambda fig: figures.append(fig) or real(fig))
    box = panel.timeline_panel(runs, POOLS)
    run, step = box.children[0].children
    step.value = step.max
    last = {name: run_[1][-1].step for name, run_ in runs.items()}
    assert last["continuous"] < last["static"]
    run.value = "continuous"
    assert step.max == last["continuous"] and step.value == last["continuous"]
    assert len(shown) == 3  # the clamp and the run change: one render
    assert figures[-1] is not figures[0] and figures[-1].axes[0].get_title(loc="left").startswith("continuous:")
    (caption,) = [t for t in figures[-1].texts if t.get_gid() == "caption"]
    assert caption.get_text().startswith(f"step {last['continuous']}, ")
    run.value = "static"  # drawn once: the first figure again, the slider's range back
    assert figures[-1] is figures[0] and step.max == last["static"] and step.value == last["continuous"]


def test_bad_input_is_named(runs):
    with pytest.raises(ValueError, match="runs is empty"):
        panel.draw_timeline({}, "static")
    with pytest.raises(ValueError, match="runs is empty"):
        panel.timeline_panel({})
    with pytest.raises(ValueError, match="unknown run 'paged'"):
        panel.draw_timeline(runs, "paged")
    steps = runs["static"][1][-1].step + 1
    for step in (-1, steps, 1.5):
        with pytest.raises(ValueError, match=f"step must be an int between 0 and {steps - 1}"):
            panel.draw_timeline(runs, "static", step)
    assert not plt.get_fignums()  # a refused step leaves no figure open
    with pytest.raises(ValueError, match="no pool size for run 'small pool'"):
        panel.timeline_panel(runs, {name: 48 for name in SETTINGS if name != "small pool"})
    with pytest.raises(ValueError, match="num_blocks"):
        panel.draw_timeline(runs, "static", 0, 0)
    with pytest.raises(ValueError, match="pair"):
        panel.draw_timeline({"x": runs["static"][0]}, "x")
    with pytest.raises(ValueError, match="no requests or no steps"):
        panel.draw_timeline({"x": (runs["static"][0], [])}, "x")
    stranger = StepRecord(0, [("zz", 1)], ["zz"], 1, 0, 0, [], 0.0)
    with pytest.raises(ValueError, match=r"not in its list: \['zz'\]"):
        panel.timeline_cells(runs["static"][0], [stranger])
