"""/docs in a real headless Chromium, on a machine with no route to any CDN: Swagger UI must render every endpoint
from the assets the server itself serves (issue 12, item 4). The screenshot committed as docs/images/docs-offline.png
comes from this test: `VGGSERVE_DOCS_SCREENSHOT=docs/images/docs-offline.png pytest tests/test_docs_browser.py`.
deploy/install.sh installs Chromium with the dev extras."""

import os
import shutil
import subprocess

from test_http_frontends import running
from vggserve.testing.servers import ServerProcess

SERVER = """
import sys
from vggserve.testing.models import SlowModel
from vggserve.serving.server import run_server
from vggserve.serving.settings import Settings

sys.exit(run_server(Settings(port=PORT), lambda device: SlowModel(device, 0.01, 4), log_level="warning"))
"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert found, "no Chromium: install it (apt-get install chromium; deploy/install.sh dev does)"
    return found


def headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=15000", *args], capture_output=True, text=True, timeout=120)


def test_swagger_ui_renders_offline_in_headless_chromium(tmp_path):
    shot = os.environ.get("VGGSERVE_DOCS_SCREENSHOT") or str(tmp_path / "docs.png")
    with running(ServerProcess.python_code(SERVER)) as server:
        server.wait_ready(60)
        dom = headless("--dump-dom", server.url + "/docs").stdout
        for path in ("/classify", "/classify/batch", "/metadata", "/v2/models/{model}/infer", "/v2/health/ready"):
            assert f'data-path="{path}"' in dom, path  # an operation rendered by Swagger UI's JavaScript
        done = headless("--window-size=1280,1400", f"--screenshot={shot}", server.url + "/docs")
    with open(shot, "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000, done.stderr[-2000:]
