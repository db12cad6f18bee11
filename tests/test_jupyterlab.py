"""JupyterLab opens each notebook, .py and shipped .ipynb (server on 127.0.0.1, contents API)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kit.paths import REPO
from kit.pipeline import notebooks
from kit.proc import stop_tree


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("rt"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={REPO}",
            "--allow-root",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("jupyter lab did not start within 60 s")
                time.sleep(0.5)
        yield base, token
    finally:
        stop_tree(proc)


@pytest.mark.parametrize("suffix", [".py", ".ipynb"])
@pytest.mark.parametrize("name", notebooks.NAMES)
def test_lab_opens_the_py_notebook_as_a_notebook(lab, name: str, suffix: str) -> None:
    """Both files of a pair open as the same notebook: the jupytext .py and the shipped .ipynb."""
    base, token = lab
    url = f"{base}/api/contents/notebooks/{name}{suffix}?type=notebook&content=1&token={token}"
    with urllib.request.urlopen(url, timeout=30) as r:
        model = json.load(r)
    assert model["type"] == "notebook"
    cells = model["content"]["cells"]
    assert cells[0]["cell_type"] == "markdown"
    assert any("parameters" in c["metadata"].get("tags", []) for c in cells)
    assert not any(c.get("outputs") for c in cells)
