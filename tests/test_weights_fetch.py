"""`vggserve weights fetch`: verify-then-rename downloads from a local HTTP server, and the hub path.

Only 127.0.0.1 is used; the real URLs cannot be reached from CI. The torchvision file is a generated legacy
checkpoint; its SHA256 prefix is passed in because a real `397923af` prefix cannot be produced.
"""

import functools
import http.server
import json
import socket
import threading
import time

import pytest

from vggserve.cli import main
from vggserve.errors import WeightsError
from vggserve.weights import find_weights, load_weights, sha256_file
from vggserve.weights.fetch import ChecksumMismatch, fetch_timm, fetch_torchvision
from vggserve.weights.provenance import TIMM, TORCHVISION


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


def test_unreachable_server_fails_fast_naming_file_and_folder(cache):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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

@pytest.fixture
def fake_hub(tmp_path, tiny_tensors, monkeypatch):
    """hf_hub_download replaced by a function returning a generated timm-layout file in a fake hub cache."""
    from safetensors.numpy import save_file
    from test_weights_formats import timm_layout

    blob = tmp_path / "hub" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    save_file(timm_layout(tiny_tensors), str(blob))
    snapshot = tmp_path / "hub" / "snapshots" / "main" / TIMM.file_name
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(blob)
    calls = []

    def hf_hub_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        return str(snapshot)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", hf_hub_download)
    return snapshot, blob, calls


def test_timm_fetch_verifies_links_into_cache_and_is_found(fake_hub, cache):
    snapshot, blob, calls = fake_hub
    path = fetch_timm(endpoint="http://127.0.0.1:1", expected_sha256=sha256_file(blob))
    assert calls == [(TIMM.hub_repo, TIMM.file_name, {"endpoint": "http://127.0.0.1:1"})]
    assert path == cache / TIMM.local_name and path.samefile(blob)
    assert find_weights() == path
    w = load_weights(path)
    assert (w.key_scheme, w.preprocessing) == ("timm", "torchvision")
    assert fetch_timm(expected_sha256=sha256_file(blob)) == path and len(calls) == 1  # already there: no call


def test_timm_checksum_mismatch_deletes_the_downloaded_file(fake_hub, cache):
    snapshot, blob, _ = fake_hub
    with pytest.raises(ChecksumMismatch, match=f"expected {TIMM.sha256}.*deleted"):
        fetch_timm()  # the published digest cannot match the generated file
    assert not blob.exists() and not snapshot.exists() and not (cache / TIMM.local_name).exists()


def test_timm_offline_names_the_file_to_copy_in_and_where(cache, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("offline mode is enabled and the file is not in the cache")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", offline)
    with pytest.raises(WeightsError) as info:
        fetch_timm()
    message = str(info.value)
    assert "\n" not in message and TIMM.url in message and str(cache / TIMM.local_name) in message
