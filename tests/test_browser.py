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

pytestmark = pytest.mark.slow

# JupyterLab settings for a quiet, fully rendered page: no news/update toasts, no cell virtualisation.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
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
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.token=", "--ServerApp.password=", "--allow-root", f"--ServerApp.root_dir={root}",
         "--ServerApp.port_retries=0", "--ServerApp.disable_check_xsrf=True"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
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

    assert CHROMIUM.exists(), "Debian's chromium is missing: apt-get install -y chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.set_default_timeout(60_000)
            page.goto(f"{jupyterlab}/lab/tree/{NOTEBOOK}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            # the kernel is connected and idle (Run All before that asks which kernel to start)
            expect(page.locator(".jp-StatusBar-TextItem", has_text="Idle").first).to_be_visible(timeout=90_000)
            expect(page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']")
                   ).to_have_count(1, timeout=90_000)

            # Run > Run All Cells
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator("li[data-command='runmenu:run-all']").click()
            # done when no cell is queued or running and the last one ran, or when a cell failed
            page.wait_for_function("""() => {
                const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
                // a cell failed: an error on stderr (a warning there, e.g. CpuKernelWarning, is not one)
                const failed = [...document.querySelectorAll(
                    ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
                    .some(o => /Error|Traceback/.test(o.textContent));
                return failed || (prompts.length && !prompts.some(p => p.includes('*'))
                                  && /\\[\\d+\\]/.test(prompts[prompts.length - 1]));
            }""", timeout=240_000)
            stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            errors = [t for t in stderr.all_text_contents() if "Error" in t or "Traceback" in t]
            assert not errors, errors[0][-2000:]
            prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
            assert all(re.search(r"\[\d+\]", p) for p in prompts), prompts

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
                timeout=120_000)
            page.wait_for_timeout(300)
            record = page.evaluate("() => { clearInterval(window.__mtpxTimer); return window.__mtpx; }")
            counts = _timeline_counts(record["titles"])
            after_reset = counts[counts.index(0):] if 0 in counts else counts
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
