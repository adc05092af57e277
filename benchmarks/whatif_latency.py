"""The what-if mode's latency in a real browser: from a slider move until both what-if charts show the new prediction.

    .venv/bin/python benchmarks/whatif_latency.py [--moves 20] [--out whatif_latency.json]

Starts JupyterLab (as ``tests/test_browser.py`` does: 127.0.0.1, a copy of ``notebooks/``, headless Debian chromium),
runs the quickstart notebook (its Explorer records an oracle), then moves the ``n_max`` slider ``--moves`` times
(between 2 and the session's largest ``n_max``) by typing into its readout. For each move it records, in the page's
own clock (``performance.now()``):

- ``table_ms``: until the numbers table shows the new ``n_max`` (the kernel's replay, the table's HTML and the comm);
- ``charts_ms``: until both charts' data show it (the figures built in the kernel, sent, and redrawn by plotly).

Then it moves ``p_min`` ``--p-min-moves`` times the same way (0.05 … 0.45, a new value each time, 1.5 s apart), then
``n_min`` ``--n-min-moves`` times (1, 2, 3, 0, …) at the largest ``n_max``.

Prints JSON (and writes it to ``--out``): the median, minimum and maximum of each, and every move's numbers. The
browser holds the frames of every setting one slider move can reach from the shown one (every ``n_max``, every
``p_min`` of the slider's steps, every ``n_min``), which the kernel prepares after each prediction, and switches to
the new setting's at once (``mtp_explorer.ui.whatif_view``), so a move costs plotly's redraw of the two charts; the
kernel's path, taken by a change of the drafter or where the browser lacks a frame, is ``kernel_ms``, measured in the
same run without the browser (one ``WhatIfController.refresh`` from scratch: replay, numbers, table and figures of the
shown setting, median over the moves), to which the comm's round trip and the redraw add.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _common import emit, machine  # noqa: E402
from test_browser import LAB_SETTINGS, _free_port, _launch, _run_all, _stop  # noqa: E402

# the move: type the value into the slider's readout and press Enter; then wait (in the page) for the table and for
# both charts to show it, reporting the times since the key press
_MOVE_JS = """async ([n]) => {
    const root = document.querySelector('.mtpx-explorer');
    const readout = [...root.querySelectorAll('.widget-slider')].find(s => s.textContent.includes('n_max'))
        .querySelector('.widget-readout');
    const status = root.querySelector('.mtpx-whatif-status');
    const charts = () => [...root.querySelectorAll('.mtpx-whatif .js-plotly-plot')];
    const shows = c => c.data && c.data.some(t => t.name === 'this setting' && t.x[0] === n);
    const depth = c => c.data && c.data.length && Math.max(...c.data[0].x) === n;
    readout.focus();
    readout.textContent = String(n);
    const t0 = performance.now();
    readout.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', keyCode: 13, bubbles: true}));
    let table = null;
    while (performance.now() - t0 < 30000) {
        if (table === null && status.textContent.includes('n_max=' + n)) table = performance.now() - t0;
        const [a, b] = charts();
        if (table !== null && depth(a) && shows(b)) return {table_ms: table, charts_ms: performance.now() - t0};
        await new Promise(r => requestAnimationFrame(r));
    }
    return {table_ms: table, charts_ms: null};
}"""


# a move of p_min or n_min: typed into its readout; the table shows it, and both charts (the speed chart's title names
# both; the acceptance chart is redrawn from the same message)
_SETTING_JS = """async ([name, text]) => {
    const root = document.querySelector('.mtpx-explorer');
    const readout = [...root.querySelectorAll('.widget-slider')].find(s => s.textContent.includes(name))
        .querySelector('.widget-readout');
    const status = root.querySelector('.mtpx-whatif-status');
    const charts = () => [...root.querySelectorAll('.mtpx-whatif .js-plotly-plot')];
    readout.focus();
    readout.textContent = text;
    const t0 = performance.now();
    readout.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', keyCode: 13, bubbles: true}));
    let table = null;
    while (performance.now() - t0 < 30000) {
        if (table === null && status.textContent.includes(name + '=' + text)) table = performance.now() - t0;
        const [a, b] = charts();
        if (table !== null && b && b.layout && String(b.layout.title.text).includes(name + ' ' + text))
            return {table_ms: table, charts_ms: performance.now() - t0};
        await new Promise(r => requestAnimationFrame(r));
    }
    return {table_ms: table, charts_ms: null};
}"""


def _start_lab(tmp: Path) -> tuple[subprocess.Popen, str]:
    root = tmp / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name, value in LAB_SETTINGS.items():
        path = tmp / "lab-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
    )
    url = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={url.rsplit(':', 1)[1]}",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.token=",
            "--ServerApp.password=",
            "--allow-root",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.port_retries=0",
            "--ServerApp.disable_check_xsrf=True",
        ],
        stdout=open(tmp / "jupyterlab.log", "w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
    )
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status", timeout=2)
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not start") from None
            time.sleep(0.5)


def _kernel_ms(moves: int) -> float:
    """One WhatIfController.refresh on the quickstart's Explorer, without a browser (median over ``moves``)."""
    import mtp_explorer as mx
    from mtp_explorer.widgets import Explorer

    with mx.Session.open(os.environ.get("MTP_EXPLORER_MODEL") or None, n_ctx=2048, n_rs_seq=8, threads=1) as s:
        ex = Explorer(s, prompt=mx.demo_prompt(), max_tokens=128, n_max=3)
        ex.record_oracle()
        ex.wait(300)
        times = []
        for i in range(moves):
            ex.controls.n_max.value = 2 + i % (s.capacity - 1)
            t0 = time.perf_counter()
            ex.update_prediction()
            times.append(1e3 * (time.perf_counter() - t0))
            ex.whatif_controller.wait_prepared(60)  # the other n_max's frames, in the background: not timed
        return statistics.median(times)


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--p-min-moves", type=int, default=10, help="moves of p_min")
    ap.add_argument("--n-min-moves", type=int, default=8, help="moves of n_min")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start_lab(Path(tmp))
        try:
            with sync_playwright() as pw:
                browser = _launch(pw)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                _run_all(page, url, "01_quickstart.ipynb")
                page.locator(".mtpx-whatif .js-plotly-plot").first.wait_for()
                capacity = int(
                    float(
                        page.locator(".mtpx-explorer .widget-slider", has_text="n_max")
                        .locator(".noUi-handle")
                        .first.get_attribute("aria-valuemax")
                        or 8
                    )
                )
                page.wait_for_timeout(5000)  # the frames of every n_max, prepared in the background
                moves = []
                for i in range(args.moves):
                    n = 2 + i % (capacity - 1)  # 2, 3, ..., capacity, 2, ...: every move a new value
                    moves.append({"n_max": n, **page.evaluate(_MOVE_JS, [n])})
                p_moves = []
                for i in range(args.p_min_moves):
                    v = round(0.05 * (1 + i % 9), 2)  # 0.05 ... 0.45: every move a new value
                    p_moves.append({"p_min": v, **page.evaluate(_SETTING_JS, ["p_min", f"{v:.2f}"])})
                    page.wait_for_timeout(1500)  # the frames around the new p_min prepared
                m_moves = []
                page.evaluate(_MOVE_JS, [capacity])  # n_min's slider goes up to n_max (not timed)
                page.wait_for_timeout(1500)
                for i in range(args.n_min_moves):
                    m = (1 + i) % 4  # 1, 2, 3, 0, ...: every move a new value
                    m_moves.append({"n_min": m, **page.evaluate(_SETTING_JS, ["n_min", str(m)])})
                    page.wait_for_timeout(1500)
                browser.close()
        finally:
            _stop(proc, url)
    done = [m for m in moves if m["charts_ms"] is not None]
    p_done = [m for m in p_moves if m["charts_ms"] is not None]
    m_done = [m for m in m_moves if m["charts_ms"] is not None]
    doc = {
        "machine": machine(),
        "moves": len(moves),
        "timed_out": len(moves) - len(done),
        "charts_ms": _stats([m["charts_ms"] for m in done]) if done else None,
        "table_ms": _stats([m["table_ms"] for m in done]) if done else None,
        "p_min_moves": len(p_moves),
        "p_min_charts_ms": _stats([m["charts_ms"] for m in p_done]) if p_done else None,
        "p_min_table_ms": _stats([m["table_ms"] for m in p_done]) if p_done else None,
        "n_min_moves": len(m_moves),
        "n_min_charts_ms": _stats([m["charts_ms"] for m in m_done]) if m_done else None,
        "n_min_table_ms": _stats([m["table_ms"] for m in m_done]) if m_done else None,
        "kernel_ms": _kernel_ms(args.moves),
        "each": moves,
        "each_p_min": p_moves,
        "each_n_min": m_moves,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    emit(doc)


if __name__ == "__main__":
    main()
