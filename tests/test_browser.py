"""A real browser: JupyterLab on 127.0.0.1, headless Debian chromium driven by playwright.

Opens a copy of ``notebooks/01_quickstart.ipynb`` (so the repository's notebook stays stripped),
runs all cells, checks that the Explorer's controls and the plotly figures are in the DOM, clicks Run
and watches the token timeline grow; saves screenshots in ``tests/artifacts/``. The model is the one
the notebook opens: ``MTP_EXPLORER_MODEL`` when set, else the bundled model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK = "01_quickstart.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# JupyterLab settings for a quiet, fully rendered page: no news/update toasts, no cell virtualisation.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


@pytest.fixture(autouse=True)
def _patient_assertions():
    """Playwright's expect() waits 5 s by default, which page.set_default_timeout does not change: on a loaded 2-core
    machine a figure drawn after a kernel's step can take longer (a make test beside other work failed so)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_available() -> None:
    if os.environ.get("MTP_EXPLORER_MODEL"):
        return
    import mtp_explorer as mx

    mx.default_model_path()  # raises ModelNotFoundError with the reason


def _stop(proc: subprocess.Popen, url: str) -> None:
    """Shut JupyterLab down (kernels included) and make sure nothing it started survives."""
    try:
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/shutdown", method="POST"), timeout=5)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in family:
        try:
            p = psutil.Process(pid)
            p.terminate()
            p.wait(timeout=5)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            p.kill()


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a copy of notebooks/, on a free port; yields its URL; always stopped."""
    _model_available()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    settings = tmp_path / "lab-settings"
    for name, value in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--allow-root",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.port_retries=0",
            "--ServerApp.disable_check_xsrf=True",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield url
    finally:
        _stop(proc, url)
        log.close()


def _launch(pw):
    """Headless Debian chromium."""
    assert CHROMIUM.exists(), "Debian's chromium is missing: apt-get install -y chromium"
    return pw.chromium.launch(
        executable_path=str(CHROMIUM),
        headless=True,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    )


def _console_errors(page) -> list[str]:
    """A list that fills with what the page logs as an error on its console, and its uncaught exceptions."""
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def _run_all(page, url: str, notebook: str, timeout_ms: int = 240_000) -> None:
    """Open ``notebook`` in JupyterLab, wait for its kernel, Run All Cells and wait until every cell ran; fails on a
    cell's error."""
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(60_000)
    page.goto(f"{url}/lab/tree/{notebook}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    # the kernel is connected and idle (Run All before that asks which kernel to start)
    expect(page.locator(".jp-StatusBar-TextItem", has_text="Idle").first).to_be_visible(timeout=90_000)
    expect(page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
        1, timeout=90_000
    )

    # Run > Run All Cells
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator("li[data-command='runmenu:run-all']").click()
    # done when no cell is queued or running and the last one ran, or when a cell failed
    page.wait_for_function(
        """() => {
        const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
        // a cell failed: an error on stderr (a warning there, e.g. CpuKernelWarning, is not one)
        const failed = [...document.querySelectorAll(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
            .some(o => /Error|Traceback/.test(o.textContent));
        return failed || (prompts.length && !prompts.some(p => p.includes('*'))
                          && /\\[\\d+\\]/.test(prompts[prompts.length - 1]));
    }""",
        timeout=timeout_ms,
    )
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    errors = [t for t in stderr.all_text_contents() if "Error" in t or "Traceback" in t]
    assert not errors, errors[0][-2000:]
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
    assert all(re.search(r"\[\d+\]", p) for p in prompts), prompts


def _timeline_counts(titles: list[str]) -> list[int]:
    return [int(m.group(1)) for t in titles if (m := re.search(r"token timeline — (\d+) tokens", t))]


def _fits(locator) -> bool:
    """Every element of ``locator`` shows its whole text (nothing cut or scrolled)."""
    return all(locator.evaluate_all("es => es.map(e => e.scrollWidth <= e.clientWidth + 1)"))


def _check_drafter_control(explorer) -> None:
    """The drafter control: llama.cpp's --spec-type values in full in a dropdown that takes a typed chain, and only
    the chosen drafters' options, each labelled with its llama.cpp flag and readable; a screenshot of it."""
    from playwright.sync_api import expect

    from mtp_explorer.core import drafters
    from mtp_explorer.ui.controls import drafter_choices

    controls = explorer.locator(".mtpx-controls")
    spec = controls.locator(".mtpx-spec-type")
    field = spec.locator("input")
    expect(field).to_have_value("draft-mtp")
    offered = spec.locator("datalist option").evaluate_all("os => os.map(o => o.value)")
    # the quickstart's Explorer: a model with an MTP head, no draft model; the others struck through with the reason
    assert offered == [v for v, why in drafter_choices(True, False) if not why], offered
    expect(controls.locator(".mtpx-drafter-unavailable")).to_contain_text("draft-eagle3 (needs draft_model=)")
    assert _fits(spec.locator("label")) and _fits(field)
    fields = controls.locator(".mtpx-drafter-options > .widget-inline-hbox")
    assert fields.count() == len(drafters.all_options())
    expect(controls.locator(".mtpx-drafter-options > .widget-inline-hbox:visible")).to_have_count(0)  # MTP: none
    field.fill("ngram-map-k4v,draft-mtp")  # a chain no list entry names
    field.press("Enter")
    visible = controls.locator(".mtpx-drafter-options > .widget-inline-hbox:visible")
    wanted = [o.flag for o in drafters.DRAFTER_SPECS["ngram-map-k4v"].options]
    expect(visible).to_have_count(len(wanted))
    assert visible.locator("label").all_text_contents() == wanted
    assert _fits(visible.locator("label")) and _fits(field)
    expect(controls.locator(".mtpx-drafter-note")).to_contain_text("then MTP")
    controls.scroll_into_view_if_needed()
    controls.screenshot(path=str(ARTIFACTS / "browser_drafter_control.png"))
    field.fill("draft-mtp")
    field.press("Enter")
    expect(controls.locator(".mtpx-drafter-options > .widget-inline-hbox:visible")).to_have_count(0)


def test_quickstart_in_jupyterlab(jupyterlab):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = _launch(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _run_all(page, jupyterlab, NOTEBOOK)

            # the Explorer: controls and figures
            explorer = page.locator(".mtpx-explorer")
            expect(explorer).to_have_count(1)
            for label in ("Run", "Step", "Stop"):
                expect(explorer.locator("button", has_text=label)).to_have_count(1)
            for label in ("n_max", "p_min", "n_min"):
                expect(explorer.locator(".widget-slider", has_text=label)).to_have_count(1)
            expect(explorer.locator("textarea")).to_have_count(1)
            _check_drafter_control(explorer)

            expect(explorer.locator(".widget-text", has_text="max tokens")).to_have_count(1)
            # six live views, and the what-if panel's two figures: the notebook recorded an oracle
            expect(explorer.locator(".js-plotly-plot")).to_have_count(8)
            whatif = explorer.locator(".mtpx-whatif")
            expect(whatif.locator(".js-plotly-plot")).to_have_count(2)
            expect(whatif.locator(".mtpx-whatif-table")).to_contain_text("predicted")
            expect(whatif.locator(".mtpx-whatif-table")).to_contain_text("measured / predicted")
            assert page.locator(".jp-OutputArea .js-plotly-plot").count() >= 10  # plus the plain figures
            timeline = explorer.locator(".mtpx-token-timeline .js-plotly-plot")
            expect(timeline.locator(".gtitle")).to_contain_text("token timeline")
            before = _timeline_counts([timeline.locator(".gtitle").text_content()])
            assert before and before[0] > 0, "the notebook's own run should have filled the timeline"

            # a longer generation, then Run: record every title and status the page shows
            max_tokens = explorer.locator(".widget-text", has_text="max tokens").locator("input")
            max_tokens.fill("400")
            max_tokens.press("Enter")
            page.evaluate("""() => {
                const root = document.querySelector('.mtpx-explorer');
                window.__mtpx = {titles: [], status: []};
                window.__mtpxTimer = setInterval(() => {
                    const t = root.querySelector('.mtpx-token-timeline .gtitle');
                    const s = root.querySelector('.mtpx-status');
                    const rec = window.__mtpx;
                    const title = t ? t.textContent : '';
                    if (title !== rec.titles[rec.titles.length - 1]) rec.titles.push(title);
                    const status = s ? s.textContent : '';
                    if (status !== rec.status[rec.status.length - 1]) rec.status.push(status);
                }, 5);
            }""")
            explorer.locator("button", has_text="Run").click()
            expect(explorer.locator("button", has_text="Run")).to_be_enabled(timeout=120_000)
            page.wait_for_function("() => window.__mtpx.status.some(s => s.startsWith('running'))", timeout=60_000)
            page.wait_for_function(
                "() => /^(budget|eos|context) /.test(window.__mtpx.status[window.__mtpx.status.length - 1])",
                timeout=120_000,
            )
            page.wait_for_timeout(300)
            record = page.evaluate("() => { clearInterval(window.__mtpxTimer); return window.__mtpx; }")
            counts = _timeline_counts(record["titles"])
            after_reset = counts[counts.index(0) :] if 0 in counts else counts
            assert 0 in counts, f"the timeline was not reset at Run: {record['titles']}"
            assert len(set(after_reset)) >= 2 and after_reset == sorted(after_reset), counts
            assert after_reset[-1] > before[0], counts  # 400 tokens now, 128 before (unless eos came first)
            expect(explorer.locator(".mtpx-error")).to_have_count(0)

            page.set_viewport_size({"width": 1400, "height": 3000})
            explorer.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "browser_explorer.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser_failure.png"))
            raise
        finally:
            browser.close()


_CHART_DATA = "el => JSON.stringify((el.data || []).map(t => [t.name, t.x, t.y]))"


def test_whatif_charts_follow_after_an_unavailable_drafter(jupyterlab):
    """Issue 53's stale charts: choose a drafter the session cannot run (the what-if charts hide), come back to
    draft-mtp, Record oracle and move n_max: both what-if charts show the new prediction, and the console stays free
    of errors from Run All on (it logged "gd.data must be an array" when a chart's removed view kept listening)."""
    from playwright.sync_api import expect, sync_playwright

    from mtp_explorer.core import drafters
    from mtp_explorer.ui.controls import drafter_choices

    # the first drafter the quickstart's Explorer (an MTP head, no draft model) offers disabled: draft-simple
    unavailable = next(value for value, why in drafter_choices(True, False) if why)
    with sync_playwright() as pw:
        browser = _launch(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = _console_errors(page)
        try:
            _run_all(page, jupyterlab, NOTEBOOK)
            assert not errors, errors
            explorer = page.locator(".mtpx-explorer")
            whatif = explorer.locator(".mtpx-whatif")
            charts = whatif.locator(".js-plotly-plot")
            expect(charts).to_have_count(2)
            before = [c.evaluate(_CHART_DATA) for c in charts.all()]
            field = explorer.locator(".mtpx-controls .mtpx-spec-type input")
            field.fill(unavailable)
            field.press("Enter")
            expect(whatif.locator(".mtpx-whatif-status")).to_contain_text("draft")
            expect(whatif.locator(".js-plotly-plot:visible")).to_have_count(0)
            field.fill(drafters.DRAFT_MTP)
            field.press("Enter")
            expect(whatif.locator(".js-plotly-plot:visible")).to_have_count(2)
            record = whatif.locator("button", has_text="Record oracle")
            record.click()
            expect(record).to_be_disabled()
            expect(record).to_be_enabled(timeout=120_000)
            readout = explorer.locator(".widget-slider", has_text="n_max").locator(".widget-readout")
            readout.click()
            page.keyboard.press("Control+A")
            page.keyboard.type("5")
            page.keyboard.press("Enter")
            expect(whatif.locator(".mtpx-whatif-status")).to_contain_text("n_max=5")
            # both charts redraw with the n_max=5 prediction (five depths; the star on n_max 5): waited for as such,
            # since the re-recorded oracle's n_max=3 prediction (new timings) may be drawn first, chart by chart
            page.wait_for_function(
                """([sel, before]) => {
                const charts = [...document.querySelectorAll(sel)];
                if (charts.length !== 2 || charts.some((c, i) =>
                        JSON.stringify((c.data || []).map(t => [t.name, t.x, t.y])) === before[i])) return false;
                const depth = Math.max(...charts[0].data.flatMap(t => (t.x || []).map(Number)));
                const star = (charts[1].data.find(t => t.name === 'this setting') || {x: [null]}).x[0];
                return depth === 5 && Number(star) === 5;
            }""",
                arg=[".mtpx-whatif .js-plotly-plot", before],
                timeout=120_000,
            )
            depth = charts.nth(0).evaluate("el => Math.max(...el.data.flatMap(t => (t.x || []).map(Number)))")
            star = charts.nth(1).evaluate("el => el.data.find(t => t.name === 'this setting').x[0]")
            assert depth == 5 and star == 5, (depth, star)
            page.wait_for_timeout(500)
            assert not errors, errors
            whatif.screenshot(path=str(ARTIFACTS / "browser_whatif_after_drafter_switch.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "browser_failure_whatif.png"))
            raise
        finally:
            browser.close()


#: The notebooks checked at a laptop's window, each with the figure the docs show and how long Run All may take.
LAYOUT_NOTEBOOKS = {
    "01_quickstart.ipynb": (".mtpx-explorer", "explorer.png", 300_000),
    "05_server_tuning.ipynb": ("server_predictions", "server_tuning.png", 1_200_000),
    "06_drafters.ipynb": ("drafters_side_by_side", "drafters.png", 600_000),
    "07_your_model.ipynb": ("verify_cost(oracle)", "your_model.png", 1_200_000),
}

# Every plotly figure in an output: how far it reaches past its output area, and the axis labels (tick labels and axis
# titles) that overlap another axis label or a subplot title (boxes overlapping by more than 2 px both ways).
_LAYOUT_JS = """() => {
    const box = e => e.getBoundingClientRect();
    const hit = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2
                          && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2;
    const out = [], skipped = [];
    for (const plot of document.querySelectorAll('.jp-OutputArea .js-plotly-plot')) {
        const svg = plot.querySelector('svg.main-svg');
        const cell = plot.closest('.jp-OutputArea-output') || plot.closest('.jp-OutputArea');
        if (!svg || box(svg).width === 0) {  // a hidden figure (a closed tab)
            skipped.push(svg ? 'hidden' : 'no svg');
            continue;
        }
        const area = box(cell), b = box(svg);
        const title = (plot.querySelector('.gtitle') || {}).textContent || '';
        const axis = [...plot.querySelectorAll(
            '.xtick text, .ytick text, [class^="g-x"][class$="title"] text, [class^="g-y"][class$="title"] text')]
            .filter(t => box(t).width > 0 && t.textContent.trim());
        const notes = [...plot.querySelectorAll('.annotation-text')].filter(t => box(t).width > 0);
        const overlaps = [];
        axis.forEach((t, i) => {
            for (const u of [...axis.slice(i + 1), ...notes])
                if (hit(box(t), box(u))) overlaps.push(t.textContent + ' / ' + u.textContent);
        });
        const view = plot.closest('[class*="mtpx-"]');
        out.push({title: title || (view ? view.className : ''), width: b.width,
                  overflow: Math.max(b.right - area.right, area.left - b.left), overlaps});
    }
    return {figures: out, skipped};
}"""


@pytest.mark.parametrize("notebook", list(LAYOUT_NOTEBOOKS))
def test_figures_fit_a_laptop_window(jupyterlab, notebook):
    """At a 1280 x 800 window with the file browser open, every figure of the notebook fits its cell and no axis label
    runs into another; a screenshot of the figure the docs show (written to docs/images/ too when
    MTP_EXPLORER_DOCS_IMAGES is set: that is how the docs' screenshots are made)."""
    from playwright.sync_api import sync_playwright

    selector, image, timeout_ms = LAYOUT_NOTEBOOKS[notebook]
    with sync_playwright() as pw:
        browser = _launch(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors = _console_errors(page)
        try:
            _run_all(page, jupyterlab, notebook, timeout_ms=timeout_ms)
            assert page.locator(".jp-FileBrowser:visible").count() == 1  # the file browser takes its share
            # every output shown once (a plain figure is drawn when its output is first shown), the last ones drawn
            page.evaluate("""async () => {
                for (const o of document.querySelectorAll('.jp-OutputArea-output')) {
                    o.scrollIntoView({block: 'center'});
                    await new Promise(r => setTimeout(r, 150));
                }
            }""")
            if selector.startswith("."):
                target = page.locator(selector).first
            else:  # the output of the cell that draws the figure
                call = f"plots.{selector}" if selector.endswith(")") else f"plots.{selector}("
                target = page.locator(".jp-CodeCell", has_text=call).last.locator(".jp-OutputArea")
            target.scroll_into_view_if_needed()
            target.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
            found = page.evaluate(_LAYOUT_JS)
            figures = found["figures"]
            assert figures, f"no figure drawn: {found['skipped']}"
            wide = [(f["title"], round(f["width"]), round(f["overflow"])) for f in figures if f["overflow"] > 1]
            assert not wide, f"figures wider than their cell: {wide}"
            crowded = [(f["title"], f["overlaps"]) for f in figures if f["overlaps"]]
            assert not crowded, f"axis labels overlapping: {crowded}"
            assert not errors, errors
            # the notebook scrolls inside its panel: a window as tall as the figure (as wide as checked), the figure
            # at its top, and the window's picture cut to the figure
            height = target.evaluate("e => e.getBoundingClientRect().height")
            page.set_viewport_size({"width": 1280, "height": int(min(height, 2600)) + 160})
            target.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1000)
            box = target.bounding_box()
            page.screenshot(
                path=str(ARTIFACTS / image),
                clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": min(box["height"], 2600)},
            )
            if os.environ.get("MTP_EXPLORER_DOCS_IMAGES"):
                docs = ROOT / "docs" / "images"
                docs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ARTIFACTS / image, docs / image)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / f"browser_failure_{notebook}.png"))
            raise
        finally:
            browser.close()
