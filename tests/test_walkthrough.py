"""The walkthrough as a user meets it: JupyterLab lists the notebooks and starts a kernel, and the
reading copy (`gemref notebooks build`) draws its figures in a real (headless) browser with no
console errors, while the executed chapters carry a PNG of every figure for viewers that run
no scripts.

The browser half opens the reading copy `make test` built (tests/book_ci.py) and needs a
Chromium (`apt-get install -y chromium`, see README); it is skipped, with that reason, only
where none is installed.
"""
from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from book_ci import ci_book
from gemref.walkthrough.params import NOTEBOOK_DIR
from gemref.report.figures import find_chromium

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, token: str, path: str, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
        return json.loads(text) if text else None


@pytest.fixture
def jupyterlab(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={NOTEBOOK_DIR}", "--ServerApp.port_retries=0"]
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()[-2000:])
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def _execute_over_websocket(base: str, token: str, kernel_id: str, code: str) -> str:
    """Run `code` in the kernel through the server's channels websocket; return the result text."""
    import uuid

    from tornado.websocket import websocket_connect

    url = base.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels?token={token}"
    ws = await websocket_connect(url)
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    try:
        while True:
            msg = json.loads(await ws.read_message())
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
                return msg["content"]["data"]["text/plain"]
    finally:
        ws.close()


def test_jupyterlab_lists_notebooks_and_starts_a_kernel(jupyterlab):
    import asyncio

    base, token = jupyterlab
    listed = {item["name"] for item in _api(base, token, "/api/contents/")["content"]}
    expected = {p.name for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb")}
    assert expected and expected <= listed, expected - listed
    kernel = _api(base, token, "/api/kernels", "POST", {"name": "python3"})
    try:
        code = "import gemref; gemref.__version__"
        result = asyncio.run(asyncio.wait_for(_execute_over_websocket(base, token, kernel["id"], code), 120))
        assert result.strip("'") == __import__("gemref").__version__
    finally:
        _api(base, token, f"/api/kernels/{kernel['id']}", "DELETE")


# Per plotly figure on the page: its box, the traces drawn, the marks with a real path, their area.
PLOTS_JS = """(() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => {
  const box = el.getBoundingClientRect();
  const traces = Array.from(el.querySelectorAll('g.trace'));
  const area = traces.reduce((a, t) => { const b = t.getBBox(); return a + b.width * b.height; }, 0);
  const marks = traces.reduce((n, t) => n + Array.from(t.querySelectorAll('path'))
      .filter(p => (p.getAttribute('d') || '').length > 4).length, 0);
  return {width: box.width, height: box.height, traces: traces.length, marks: marks, area: area};
}))()"""


async def _open_page(url: str, chromium: str) -> tuple[list[dict], list[str]]:
    """Load `url` in headless Chromium (DevTools protocol); return its plotly figures and every
    console error, uncaught exception and failed load."""
    import asyncio

    import choreographer

    problems: list[str] = []

    async def on_console(msg):
        if msg["params"]["type"] in ("error", "assert"):
            problems.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                   for a in msg["params"]["args"]))

    async def on_exception(msg):
        details = msg["params"]["exceptionDetails"]
        problems.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))

    async def on_log(msg):
        if msg["params"]["entry"]["level"] == "error":
            problems.append(f"log: {msg['params']['entry']['text']} {msg['params']['entry'].get('url', '')}")

    async with choreographer.Browser(path=chromium, headless=True) as browser:
        tab = await browser.create_tab("")
        tab.subscribe("Runtime.consoleAPICalled", on_console)
        tab.subscribe("Runtime.exceptionThrown", on_exception)
        tab.subscribe("Log.entryAdded", on_log)
        for domain in ("Runtime", "Log", "Page"):
            await tab.send_command(f"{domain}.enable")
        loaded = tab.subscribe_once("Page.loadEventFired")
        await tab.send_command("Page.navigate", params={"url": url})
        await asyncio.wait_for(loaded, 60)
        await asyncio.sleep(1.0)                                    # let plotly finish drawing
        result = await tab.send_command("Runtime.evaluate", params={"expression": PLOTS_JS, "returnByValue": True})
    return result["result"]["result"]["value"], problems


def _figure_outputs(executed: Path) -> list[dict]:
    nb = json.loads(executed.read_text())
    return [o["data"] for c in nb["cells"] for o in c.get("outputs", []) if PLOTLY_MIME in o.get("data", {})]


def test_reading_copy_draws_in_chromium(tmp_path, data_root):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium): cannot render the reading copy")
    import asyncio
    import base64
    import io

    import numpy as np
    from PIL import Image

    chapter = "06_load_balancing"
    out = ci_book([chapter, "10_waterfall"], tmp_path / "book")     # make test's reading copy, or built here
    figures = _figure_outputs(out / "executed" / f"{chapter}.ipynb")
    from gemref.walkthrough.headline import reference_waterfall

    on_index = 1 + (reference_waterfall() is not None)              # this copy's waterfall, and make demo's
    for page, expected in (("index.html", on_index), (f"{chapter}.html", len(figures))):
        plots, problems = asyncio.run(asyncio.wait_for(_open_page((out / page).as_uri(), chromium), 180))
        assert not problems, f"{page}: {problems}"
        assert len(plots) == expected, f"{page}: {len(plots)} figures drawn, {expected} expected"
        for plot in plots:
            assert plot["width"] > 100 and plot["height"] > 100, (page, plot)
            assert plot["traces"] > 0 and plot["marks"] > 0 and plot["area"] > 0, f"{page}: an empty plot {plot}"
    # Viewers that run no scripts get the PNG each figure carries beside its interactive form.
    for data in figures:
        assert "text/html" in data and "image/png" in data, sorted(data)
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(data["image/png"]))).convert("RGB"))
        assert (pixels.min(axis=2) < 235).mean() > 0.01, "a blank PNG"


CHAPTERS = sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
# On a chapter's page: its plotly figures, its HTML tables, and any stderr output block.
PAGE_JS = """(() => ({plots: document.querySelectorAll('.js-plotly-plot').length,
  tables: document.querySelectorAll('table.gemref-table').length,
  stderr: document.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length}))()"""


def _outputs(executed: Path) -> list[dict]:
    nb = json.loads(executed.read_text())
    return [o for c in nb["cells"] for o in c.get("outputs", [])]


@pytest.fixture(scope="module")
def whole_book(tmp_path_factory, data_root):
    """Every chapter, executed under ci: make test's reading copy, or built here."""
    return ci_book(CHAPTERS, tmp_path_factory.mktemp("whole-book"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_shows_a_figure_an_html_table_and_no_stderr(whole_book, chapter):
    from book_ci import executed

    outputs = _outputs(executed(whole_book, chapter))
    assert any(PLOTLY_MIME in o.get("data", {}) for o in outputs), f"{chapter}: no figure"
    assert any("gemref-table" in "".join(o.get("data", {}).get("text/html", "")) for o in outputs), \
        f"{chapter}: no HTML table (walkthrough.show_table)"
    stderr = ["".join(o["text"])[:200] for o in outputs if o.get("output_type") == "stream" and o["name"] == "stderr"]
    assert not stderr, f"{chapter}: stderr in the reading copy: {stderr}"


def test_every_chapter_page_draws_its_figures_and_tables_in_chromium(whole_book):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium): cannot render the reading copy")
    import asyncio

    async def visit(url: str) -> dict:
        import choreographer

        async with choreographer.Browser(path=chromium, headless=True) as browser:
            tab = await browser.create_tab("")
            await tab.send_command("Page.enable")
            loaded = tab.subscribe_once("Page.loadEventFired")
            await tab.send_command("Page.navigate", params={"url": url})
            await asyncio.wait_for(loaded, 60)
            await asyncio.sleep(0.5)
            result = await tab.send_command("Runtime.evaluate", params={"expression": PAGE_JS, "returnByValue": True})
        return result["result"]["result"]["value"]

    for chapter in CHAPTERS:
        page = asyncio.run(asyncio.wait_for(visit((whole_book / f"{chapter}.html").as_uri()), 180))
        assert page["plots"] >= 1 and page["tables"] >= 1 and page["stderr"] == 0, (chapter, page)
    index = asyncio.run(asyncio.wait_for(visit((whole_book / "index.html").as_uri()), 180))
    assert index["plots"] >= 1 and index["tables"] >= 1, index      # the reference waterfall: figure and table


class _FakeKaleido:
    """kaleido's sync-server API, scripted: each export pops the next outcome (bytes or an error)."""

    def __init__(self, outcomes):
        self.outcomes, self.calls = list(outcomes), []

    def start_sync_server(self, **kwargs):
        self.calls.append("start")

    def stop_sync_server(self, **kwargs):
        self.calls.append("stop")

    def calc_fig_sync(self, fig_dict, opts):
        self.calls.append("export")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_a_png_export_that_finds_kaleidos_page_unloaded_restarts_the_server_once(monkeypatch):
    import base64

    from gemref.walkthrough import static_figures

    monkeypatch.setattr(static_figures.atexit, "register", lambda *a, **k: None)
    fake = _FakeKaleido([RuntimeError("ReferenceError: kaleido_scopes is not defined"), b"png", b"png2"])
    monkeypatch.setitem(sys.modules, "kaleido", fake)
    renderer = static_figures._png_renderer()
    assert base64.b64decode(renderer.to_mimebundle({})["image/png"]) == b"png"
    assert base64.b64decode(renderer.to_mimebundle({})["image/png"]) == b"png2"
    assert fake.calls == ["start", "export", "stop", "start", "export", "export"]
    # any other failure, or the same one twice, is raised, not retried
    for outcomes in ([RuntimeError("Chromium crashed")],
                     [RuntimeError("kaleido_scopes is not defined")] * 2):
        fake = _FakeKaleido(outcomes)
        monkeypatch.setitem(sys.modules, "kaleido", fake)
        with pytest.raises(RuntimeError):
            static_figures._png_renderer().to_mimebundle({})
