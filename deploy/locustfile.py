"""Locust load test for the vggserve HTTP service: posts real image files to /classify, like
`vggserve loadtest` does (see docs/loadtest.md for when to use which).

    VGGSERVE_IMAGES=./pictures locust -f deploy/locustfile.py --host http://127.0.0.1:8000
    VGGSERVE_IMAGES=./pictures locust -f deploy/locustfile.py --host http://127.0.0.1:8000 \\
        --headless --users 16 --spawn-rate 16 --run-time 60s --csv results/locust

Environment:
  VGGSERVE_IMAGES         folder of .jpg/.jpeg/.png/.webp/.bmp/.gif files, cycled (required)
  VGGSERVE_API_KEY        sent as `Authorization: Bearer KEY` when set
  VGGSERVE_MULTIPART      1: post as multipart field `file` instead of a raw body
  VGGSERVE_RATE_PER_USER  requests/s each user aims at (locust's constant_throughput); unset: each user
                          sends its next request as soon as the last one returns (a closed loop)

Each answer other than 200 with a `predictions` list is a failure named by its status (429 queue full,
413 too large, 504 deadline, ...). Locust's users are a closed loop: when the service slows down they send
less, so its latencies leave out the queueing an open-loop client would see (coordinated omission). For
latency under a fixed offered rate use `vggserve loadtest --mode open`.
"""

import itertools
import os
from pathlib import Path

from locust import HttpUser, between, constant_throughput, events, task

CONTENT_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
                 ".bmp": "image/bmp", ".gif": "image/gif"}
FAILURE_NAMES = {413: "413 too large", 429: "429 queue full", 503: "503 not ready", 504: "504 deadline"}


def load_images(folder: str) -> list[tuple[str, bytes, str]]:
    """(name, bytes, content type) of every image file under `folder`, in name order."""
    root = Path(folder)
    if not root.is_dir():
        raise SystemExit(f"locustfile: VGGSERVE_IMAGES={folder!r} is not a folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in CONTENT_TYPES)
    images = [(p.name, p.read_bytes(), CONTENT_TYPES[p.suffix.lower()]) for p in files]
    images = [image for image in images if image[1]]
    if not images:
        raise SystemExit(f"locustfile: VGGSERVE_IMAGES={folder!r} holds no image files")
    return images


IMAGES: list = []
NEXT_IMAGE = iter(())


@events.init.add_listener
def read_images(environment, **_kwargs):
    """Load the images once per locust process, before any user starts."""
    global IMAGES, NEXT_IMAGE
    folder = os.environ.get("VGGSERVE_IMAGES")
    if not folder:
        raise SystemExit("locustfile: set VGGSERVE_IMAGES to a folder of images to post")
    IMAGES = load_images(folder)
    NEXT_IMAGE = itertools.cycle(IMAGES)


def _wait_time():
    rate = os.environ.get("VGGSERVE_RATE_PER_USER")
    return constant_throughput(float(rate)) if rate else between(0, 0)


class ClassifyUser(HttpUser):
    """One client posting the images in turn to /classify."""

    wait_time = _wait_time()

    def on_start(self):
        key = os.environ.get("VGGSERVE_API_KEY")
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"
        self.multipart = os.environ.get("VGGSERVE_MULTIPART") == "1"

    @task
    def classify(self):
        name, data, content_type = next(NEXT_IMAGE)
        if self.multipart:
            body = {"files": {"file": (name, data, content_type)}}
        else:
            body = {"data": data, "headers": {"Content-Type": content_type}}
        with self.client.post("/classify", name="/classify", catch_response=True, **body) as response:
            if response.status_code == 200:
                try:
                    ok = isinstance(response.json().get("predictions"), list)
                except ValueError:
                    ok = False
                if ok:
                    response.success()
                else:
                    response.failure("200 without a predictions list")
            else:
                status = response.status_code
                response.failure(FAILURE_NAMES.get(status, f"{status} error" if status else "connection error"))
