"""Download published VGG16 weights, verify them, and put them where `find_weights` looks.

timm: through ``huggingface_hub.hf_hub_download`` (its cache, token, ``HF_ENDPOINT`` mirror and
``HF_HUB_OFFLINE`` apply), SHA256-checked, then hard-linked (else symlinked, else copied) into the folder.
torchvision: streamed over HTTP(S) with a progress bar to a temporary name in the folder, checked against the
SHA256 prefix in its file name (and the full digest once recorded in ``<file>.json``), then renamed.
A file that fails its check is deleted. Offline or unreachable, fetching fails at once with a message that
names the file to copy in by hand and the folder it goes to.
"""

import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import WeightsError, describe
from ..jsonfile import write_json_atomically
from ..tempfiles import temporary_beside
from .loaded import sha256_file
from .lookup import weights_dir
from .provenance import TIMM, TORCHVISION, WeightsSource

ENV_TORCHVISION_URL = "VGGSERVE_TORCHVISION_URL"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0


class ChecksumMismatch(WeightsError):
    """A downloaded file is not the published one; it has been deleted."""


def fetch(source: str = "timm", folder=None, url=None, endpoint=None, progress: bool = True) -> Path:
    """Fetch `source` ("timm" or "torchvision") into `folder` (default: `weights_dir()`); returns the file."""
    if source == "timm":
        return fetch_timm(folder, endpoint=endpoint)
    if source == "torchvision":
        return fetch_torchvision(folder, url=url, progress=progress)
    raise WeightsError(f"unknown weights source {source!r} (choose timm or torchvision)")


def fetch_timm(folder=None, endpoint=None, expected_sha256: str = TIMM.sha256) -> Path:
    """timm/vgg16.tv_in1k model.safetensors via the Hugging Face hub; `endpoint` overrides $HF_ENDPOINT."""
    target = Path(folder or weights_dir()) / TIMM.local_name
    if target.is_file():
        if sha256_file(target) == expected_sha256:
            return target
        target.unlink()
    downloaded = Path(_hub_cached() or _hub_download(target, endpoint))
    digest = sha256_file(downloaded)
    if digest != expected_sha256:
        _remove_download(downloaded)
        raise ChecksumMismatch(
            f"checksum mismatch: {TIMM.file_name} from {TIMM.hub_repo} has sha256 {digest}, expected "
            f"{expected_sha256}; the downloaded file was deleted"
        )
    _place(downloaded, target)
    return target


def _hub_cached() -> str | None:
    """The file from the Hugging Face cache when it is already there (no network), else None."""
    import huggingface_hub

    try:
        return huggingface_hub.hf_hub_download(repo_id=TIMM.hub_repo, filename=TIMM.file_name, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError) or an unreadable cache
        return None


def _hub_download(target: Path, endpoint: str | None) -> str:
    """Download through huggingface_hub, after checking that the hub can be reached at all: offline,
    huggingface_hub would retry for about half a minute before giving up."""
    import huggingface_hub
    from huggingface_hub import constants

    if _offline() or constants.HF_HUB_OFFLINE:
        raise _unreachable(TIMM, target, "HF_HUB_OFFLINE is set and the file is not in the Hugging Face cache")
    endpoint = endpoint or constants.ENDPOINT
    problem = _unreachable_host(endpoint)
    if problem:
        raise _unreachable(TIMM, target, f"cannot reach {endpoint}: {problem}")
    try:
        return huggingface_hub.hf_hub_download(repo_id=TIMM.hub_repo, filename=TIMM.file_name, endpoint=endpoint)
    except Exception as exc:  # HTTP errors, connection errors of several types
        raise _unreachable(TIMM, target, describe(exc)) from None


def _unreachable_host(url: str) -> str | None:
    """Why a TCP connection to `url`'s host fails, or to the proxy the environment sets for it (HTTPS_PROXY,
    ALL_PROXY, ... unless NO_PROXY names the host); None if it works. Through a proxy that answers, only a
    download can tell."""
    parts = urlsplit(url)
    proxy = _proxy_for(parts.scheme, parts.hostname or "")
    target = urlsplit(proxy) if proxy else parts
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        problem = exc.strerror or str(exc) or type(exc).__name__
        return f"{problem} (through the proxy {proxy})" if proxy else problem
    return None


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy URL the environment sets for `scheme`://`host`, as HTTP clients read it; None for none."""
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def fetch_torchvision(folder=None, url=None, expected_prefix: str = TORCHVISION.sha256_prefix,
                      progress: bool = True) -> Path:
    """vgg16-397923af.pth from `url` (default: $VGGSERVE_TORCHVISION_URL, else the published URL)."""
    url = url or os.environ.get(ENV_TORCHVISION_URL) or TORCHVISION.url
    target = Path(folder or weights_dir()) / TORCHVISION.local_name
    sidecar = target.with_name(target.name + ".json")
    known = _recorded_sha256(sidecar) or TORCHVISION.sha256
    if target.is_file():
        if _matches(sha256_file(target), expected_prefix, known):
            return target
        target.unlink()  # not the published file: it must not be found by the default lookup either
    if _offline():
        raise _unreachable(TORCHVISION, target, "HF_HUB_OFFLINE is set", url)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, digest = _download(url, target, progress)
    if not _matches(digest, expected_prefix, known):
        Path(tmp).unlink(missing_ok=True)
        wanted = known or f"a digest starting with {expected_prefix}"
        raise ChecksumMismatch(
            f"checksum mismatch: {TORCHVISION.file_name} from {url} has sha256 {digest}, expected {wanted}; "
            "the download was deleted"
        )
    os.replace(tmp, target)
    record = {"file": target.name, "url": url, "sha256": digest, "sha256_prefix": expected_prefix}
    write_json_atomically(sidecar, record)
    return target


def _download(url: str, target: Path, progress: bool) -> tuple[str, str]:
    """Stream `url` to a temporary file next to `target`; (temporary path, sha256). Deletes it on failure."""
    import hashlib

    import httpx
    from tqdm import tqdm

    fd, tmp = temporary_beside(target, ".part")
    digest = hashlib.sha256()
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as resp:
            if resp.status_code != 200:
                raise _unreachable(TORCHVISION, target, f"HTTP {resp.status_code}", url)
            total = int(resp.headers.get("content-length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name, disable=not progress) as bar:
                for chunk in resp.iter_bytes(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            if total is not None and out.tell() != total:
                raise WeightsError(f"incomplete download of {url}: {out.tell()} of {total} bytes")
            out.flush()
            os.fsync(out.fileno())
    except httpx.HTTPError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unreachable(TORCHVISION, target, describe(exc), url) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp, digest.hexdigest()


def _matches(digest: str, prefix: str, full: str | None) -> bool:
    return digest == full if full else digest.startswith(prefix)


def _recorded_sha256(sidecar: Path) -> str | None:
    try:
        return json.loads(sidecar.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _unreachable(src: WeightsSource, target: Path, reason: str, url: str | None = None) -> WeightsError:
    return WeightsError(
        f"cannot download {src.file_name} ({reason}); if this machine is offline, download "
        f"{url or src.url} elsewhere and copy it to {target} (folder {target.parent})"
    )


def _remove_download(path: Path) -> None:
    """Delete a bad hub download: the snapshot link and the blob it points to."""
    real = path.resolve()
    path.unlink(missing_ok=True)
    real.unlink(missing_ok=True)


def _place(src: Path, target: Path) -> None:
    """Put `src` at `target`: a hard link (no extra space, survives hub cache cleanup), else a symlink, else a
    copy; through a temporary name so `target` is never half-written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    real = src.resolve()
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")  # a name of its own per fetch
    try:
        try:
            os.link(real, tmp)
        except OSError:
            try:
                os.symlink(real, tmp)
            except OSError:
                shutil.copyfile(real, tmp)
        os.replace(tmp, target)
        tmp.unlink(missing_ok=True)  # still there when target already was a hard link to the same file: rename
        # leaves both names then
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
