"""The walkthrough as a user meets it: JupyterLab lists the notebooks and starts a kernel, and an
executed notebook's plotly figure draws in a real (headless) browser.

The browser half needs a Chromium (`apt-get install -y chromium`, see README); it is skipped,
with that reason, only where none is installed.
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

from gemref.notebooks import NOTEBOOK_DIR, execute, profile_params
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


def _first_plotly_figure(executed: Path) -> dict:
    nb = json.loads(executed.read_text())
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            if PLOTLY_MIME in output.get("data", {}):
                return output["data"][PLOTLY_MIME]
    raise AssertionError(f"{executed} has no plotly output")


def test_executed_notebook_figure_draws_in_chromium(tmp_path, data_root):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium installed (apt-get install -y chromium): cannot render the figure")
    import plotly.graph_objects as go
    from PIL import Image

    name = "00_mfu_baseline"
    params = profile_params("ci", name)
    executed = tmp_path / f"{name}.ipynb"
    execute(NOTEBOOK_DIR / f"{name}.ipynb", executed, params)
    fig = go.Figure(_first_plotly_figure(executed))
    page = tmp_path / "figure.html"
    fig.write_html(page, include_plotlyjs=True, full_html=True)      # offline: plotly.js inlined
    shot = tmp_path / "figure.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,650",
                    "--virtual-time-budget=5000", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    image = Image.open(shot).convert("RGB")
    pixels = list(image.getdata())
    non_white = sum(1 for p in pixels if min(p) < 235) / len(pixels)
    # Plotly's first trace colour (#636efa) must appear: the bars were drawn, not just a frame.
    trace_blue = sum(1 for r, g, b in pixels if abs(r - 99) < 25 and abs(g - 110) < 25 and b > 220)
    assert non_white > 0.01, f"screenshot is blank ({non_white:.2%} non-white)"
    assert trace_blue > 200, f"no bars drawn ({trace_blue} pixels of the first trace colour)"
