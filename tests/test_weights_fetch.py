"""`vggserve weights fetch`: verify-then-rename downloads from a local HTTP server, and the hub path.

Only 127.0.0.1 is used; the real URLs cannot be reached from CI. The torchvision file is a generated legacy
checkpoint; its SHA256 prefix is passed in because a real `397923af` prefix cannot be produced.
"""

import functools
import http.server
import json
import os
import socket
import threading
import time

import pytest

from vggserve.cli import main
from vggserve.errors import WeightsError
from vggserve.weights import find_weights, load_weights, sha256_file
from vggserve.weights.fetch import ChecksumMismatch, fetch_timm, fetch_torchvision
from vggserve.weights.provenance import TIMM, TORCHVISION


# the environment's proxy settings, as HTTP clients read them
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                   "no_proxy")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, tiny_tensors):
    """(base URL, served folder) of an HTTP server on 127.0.0.1 holding a generated vgg16-397923af.pth."""
    from test_weights_pth import state_dict, write_legacy

    root = tmp_path / "www"
    root.mkdir()
    write_legacy(root / TORCHVISION.file_name, *state_dict(tiny_tensors))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=root))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VGGSERVE_WEIGHTS", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "cache" / "weights"


def test_torchvision_download_is_verified_renamed_recorded_and_found(served, cache):
    base, root = served
    digest = sha256_file(root / TORCHVISION.file_name)
    path = fetch_torchvision(url=f"{base}/{TORCHVISION.file_name}", expected_prefix=digest[:8], progress=False)
    assert path == cache / TORCHVISION.file_name
    assert sorted(p.name for p in cache.iterdir()) == [TORCHVISION.file_name, TORCHVISION.file_name + ".json"]
    sidecar = json.loads((cache / (TORCHVISION.file_name + ".json")).read_text())
    assert sidecar["sha256"] == digest and sidecar["url"].startswith(base)
    assert find_weights() == path  # the default lookup finds it with no flags
    assert load_weights(path).format == "pth-legacy"


def test_downloaded_weights_get_the_permissions_the_umask_gives(served, cache):
    base, root = served
    digest = sha256_file(root / TORCHVISION.file_name)
    previous = os.umask(0o022)
    try:
        path = fetch_torchvision(url=f"{base}/{TORCHVISION.file_name}", expected_prefix=digest[:8], progress=False)
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o644


def test_torchvision_checksum_mismatch_deletes_the_download(served, cache):
    base, _ = served
    with pytest.raises(ChecksumMismatch) as info:
        fetch_torchvision(url=f"{base}/{TORCHVISION.file_name}", progress=False)  # the real prefix 397923af
    message = str(info.value)
    assert "checksum mismatch" in message and "397923af" in message and "deleted" in message
    assert not cache.exists() or list(cache.iterdir()) == []  # no partial or temporary file left


def test_recorded_full_digest_is_enforced_on_the_next_fetch(served, cache):
    base, root = served
    url = f"{base}/{TORCHVISION.file_name}"
    digest = sha256_file(root / TORCHVISION.file_name)
    path = fetch_torchvision(url=url, expected_prefix=digest[:8], progress=False)
    path.write_bytes(path.read_bytes() + b"tampered")  # same prefix no longer enough: full digest recorded
    again = fetch_torchvision(url=url, expected_prefix=digest[:8], progress=False)  # re-downloads
    assert sha256_file(again) == digest


def test_existing_file_that_fails_its_check_is_deleted_even_if_download_fails(cache):
    cache.mkdir(parents=True)
    (cache / TORCHVISION.file_name).write_bytes(b"not the published file")
    with pytest.raises(WeightsError, match="cannot download"):
        fetch_torchvision(url=f"http://127.0.0.1:{_closed_port()}/x.pth", progress=False)
    assert not (cache / TORCHVISION.file_name).exists()


def test_unreachable_server_fails_fast_naming_file_and_folder(cache):
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(WeightsError) as info:
        fetch_torchvision(url=f"http://127.0.0.1:{port}/{TORCHVISION.file_name}", progress=False)
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert TORCHVISION.file_name in message and str(cache) in message and "copy it to" in message
    assert not cache.exists() or list(cache.iterdir()) == []


def test_http_error_is_a_weights_error(served, cache):
    base, _ = served
    with pytest.raises(WeightsError, match="HTTP 404"):
        fetch_torchvision(url=f"{base}/missing.pth", progress=False)


def test_offline_setting_fails_before_any_connection(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE is set.*copy it to"):
        fetch_torchvision(url="http://127.0.0.1:9/never", progress=False)


def test_fetch_cli_with_url_env_and_dir(served, cache, tmp_path, monkeypatch, capsys):
    base, root = served
    monkeypatch.setenv("VGGSERVE_TORCHVISION_URL", f"{base}/{TORCHVISION.file_name}")
    code = main(["weights", "fetch", "--source", "torchvision", "--dir", str(tmp_path / "d"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 4 and "checksum mismatch" in err and err.count("\n") == 1  # the real prefix, on our test file
    assert list((tmp_path / "d").iterdir()) == []


# ---- timm through huggingface_hub (monkeypatched: no hub here) ------------------------------------------------

def _closed_port():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeHub:
    """Stands in for huggingface_hub.hf_hub_download: a generated timm-layout file behind a snapshot link, as in
    the hub cache; `local_files_only` calls find it only once it has been "downloaded"."""

    def __init__(self, root, tensors):
        from safetensors.numpy import save_file
        from test_weights_formats import timm_layout

        self.blob = root / "blobs" / "abc"
        self.blob.parent.mkdir(parents=True)
        save_file(timm_layout(tensors), str(self.blob))
        self.snapshot = root / "snapshots" / "main" / TIMM.file_name
        self.snapshot.parent.mkdir(parents=True)
        self.snapshot.symlink_to(self.blob)
        self.cached = False
        self.downloads = []

    def __call__(self, repo_id, filename, local_files_only=False, **kwargs):
        from huggingface_hub.errors import LocalEntryNotFoundError

        assert (repo_id, filename) == (TIMM.hub_repo, TIMM.file_name)
        if local_files_only:
            if not self.cached:
                raise LocalEntryNotFoundError("not in the local cache")
            return str(self.snapshot)
        self.downloads.append(kwargs)
        self.cached = True
        return str(self.snapshot)


@pytest.fixture
def fake_hub(tmp_path, tiny_tensors, monkeypatch):
    hub = FakeHub(tmp_path / "hub", tiny_tensors)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", hub)
    return hub


def test_timm_fetch_verifies_links_into_cache_and_is_found(fake_hub, served, cache):
    endpoint = served[0]  # any reachable HTTP server passes the reachability check
    expected = sha256_file(fake_hub.blob)
    path = fetch_timm(endpoint=endpoint, expected_sha256=expected)
    assert fake_hub.downloads == [{"endpoint": endpoint}]
    assert path == cache / TIMM.local_name and path.samefile(fake_hub.blob)
    assert find_weights() == path
    w = load_weights(path)
    assert (w.key_scheme, w.preprocessing) == ("timm", "torchvision")
    assert fetch_timm(endpoint=endpoint, expected_sha256=expected) == path and len(fake_hub.downloads) == 1


def test_timm_file_already_in_hub_cache_needs_no_network(fake_hub, cache, monkeypatch):
    fake_hub.cached = True
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = fetch_timm(endpoint=f"http://127.0.0.1:{_closed_port()}", expected_sha256=sha256_file(fake_hub.blob))
    assert path.samefile(fake_hub.blob) and fake_hub.downloads == []


def test_timm_checksum_mismatch_deletes_the_downloaded_file(fake_hub, served, cache):
    with pytest.raises(ChecksumMismatch, match=f"expected {TIMM.sha256}.*deleted"):
        fetch_timm(endpoint=served[0])  # the published digest cannot match the generated file
    assert not fake_hub.blob.exists() and not fake_hub.snapshot.exists()
    assert not (cache / TIMM.local_name).exists()


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "unreachable"])
def test_timm_offline_fails_fast_naming_the_file_to_copy_in_and_where(fake_hub, cache, monkeypatch, how):
    if how == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for proxy in PROXY_VARIABLES:
        monkeypatch.delenv(proxy, raising=False)
    t0 = time.monotonic()
    with pytest.raises(WeightsError) as info:
        fetch_timm(endpoint=f"http://127.0.0.1:{_closed_port()}")
    assert time.monotonic() - t0 < 5 and fake_hub.downloads == []
    message = str(info.value)
    assert "\n" not in message and TIMM.url in message and str(cache / TIMM.local_name) in message


def test_timm_hub_errors_become_weights_errors(cache, served, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    def failing(*args, local_files_only=False, **kwargs):
        raise LocalEntryNotFoundError("gone") if local_files_only else RuntimeError("HTTP 500 from the hub")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", failing)
    with pytest.raises(WeightsError, match=r"cannot download model\.safetensors \(RuntimeError: HTTP 500"):
        fetch_timm(endpoint=served[0])


def test_timm_through_an_unreachable_proxy_fails_before_the_hub_is_asked(fake_hub, cache, served, monkeypatch):
    """With HTTPS_PROXY set, the reachability check was skipped: huggingface_hub then spent about 24 s retrying a
    proxy that refused every connection before the same error came."""
    for proxy in PROXY_VARIABLES:
        monkeypatch.delenv(proxy, raising=False)
    dead = f"http://127.0.0.1:{_closed_port()}"
    for variable in ("HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(variable, dead)
        with pytest.raises(WeightsError) as info:
            fetch_timm(endpoint="https://hub.invalid")
        assert f"through the proxy {dead}" in str(info.value) and fake_hub.downloads == []
        monkeypatch.delenv(variable)
    # a host that NO_PROXY exempts is reached directly: the dead proxy does not matter
    monkeypatch.setenv("HTTP_PROXY", dead)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert fetch_timm(endpoint=served[0], expected_sha256=sha256_file(fake_hub.blob)).is_file()
    assert len(fake_hub.downloads) == 1


def test_placing_a_file_leaves_no_temporary_name_behind_and_two_placings_do_not_collide(tmp_path, monkeypatch):
    import importlib

    fetch = importlib.import_module("vggserve.weights.fetch")  # the module (the package's `fetch` is a function)
    src = tmp_path / "blob"
    src.write_bytes(b"weights")
    target = tmp_path / "out" / "vgg16.safetensors"
    taken = []
    real_replace = os.replace

    def replace(a, b):  # the first placing's rename is done while a second placing runs to its end
        taken.append(str(a))
        if len(taken) == 1:
            fetch._place(src, target)
        real_replace(a, b)

    monkeypatch.setattr(fetch.os, "replace", replace)
    fetch._place(src, target)
    assert len(set(taken)) == 2 and target.read_bytes() == b"weights"
    assert os.listdir(target.parent) == ["vgg16.safetensors"]

    def refuse(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fetch.os, "replace", refuse)
    with pytest.raises(OSError):
        fetch._place(src, tmp_path / "out" / "other.safetensors")
    assert os.listdir(target.parent) == ["vgg16.safetensors"]
