"""find_weights: explicit path, then $VGGSERVE_WEIGHTS, then fetched files in the cache; never random weights."""

import os
from pathlib import Path

import pytest

from vggserve.errors import WeightsNotFound
from vggserve.weights import find_weights, weights_dir
from vggserve.weights.provenance import SOURCES, TIMM, TORCHVISION


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder and no $VGGSERVE_WEIGHTS."""
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VGGSERVE_WEIGHTS", raising=False)
    return tmp_path / "cache" / "weights"


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_cache_dir_follows_env_override(cache):
    assert weights_dir() == cache


def test_cache_dir_defaults_to_platform_user_cache(monkeypatch):
    import platformdirs

    monkeypatch.delenv("VGGSERVE_CACHE_DIR", raising=False)
    assert weights_dir() == Path(platformdirs.user_cache_dir("vggserve")) / "weights"


def test_explicit_path_wins_over_env_and_cache(cache, tmp_path, monkeypatch):
    explicit = _touch(tmp_path / "mine.safetensors")
    monkeypatch.setenv("VGGSERVE_WEIGHTS", str(_touch(tmp_path / "env.safetensors")))
    _touch(cache / TIMM.local_name)
    assert find_weights(explicit) == explicit


def test_missing_explicit_path_is_an_error_naming_it(cache, tmp_path):
    _touch(cache / TIMM.local_name)  # present, but an explicit path never falls back
    with pytest.raises(WeightsNotFound, match="nope.safetensors does not exist"):
        find_weights(tmp_path / "nope.safetensors")


def test_env_wins_over_cache(cache, tmp_path, monkeypatch):
    env = _touch(tmp_path / "env.safetensors")
    monkeypatch.setenv("VGGSERVE_WEIGHTS", str(env))
    _touch(cache / TIMM.local_name)
    assert find_weights() == env


def test_env_pointing_nowhere_is_an_error_naming_the_variable(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("VGGSERVE_WEIGHTS", str(tmp_path / "gone.pth"))
    _touch(cache / TIMM.local_name)
    with pytest.raises(WeightsNotFound, match=r"VGGSERVE_WEIGHTS=.*gone\.pth: no such weights file"):
        find_weights()


def test_fetched_files_are_found_in_provenance_order(cache):
    tv = _touch(cache / TORCHVISION.local_name)
    assert find_weights() == tv
    timm = _touch(cache / TIMM.local_name)
    assert find_weights() == timm
    assert [s.name for s in SOURCES][:2] == ["timm", "torchvision"]


def test_dangling_link_in_cache_is_skipped(cache, tmp_path):
    cache.mkdir(parents=True)
    os.symlink(tmp_path / "cleaned-hub-blob", cache / TIMM.local_name)
    tv = _touch(cache / TORCHVISION.local_name)
    assert find_weights() == tv


def test_nothing_found_is_one_line_with_every_way_to_get_weights(cache):
    with pytest.raises(WeightsNotFound) as info:
        find_weights()
    message = str(info.value)
    assert "\n" not in message and str(cache) in message
    for hint in ("vggserve weights fetch", "--weights PATH", "VGGSERVE_WEIGHTS",
                 "vggserve weights init --seed 0 --output PATH"):
        assert hint in message


def test_a_folder_named_as_the_weights_file_says_it_is_a_folder(cache, tmp_path, monkeypatch):
    """`--weights weights/` (or VGGSERVE_WEIGHTS=weights/, or load_weights of a folder) said the folder did not
    exist."""
    from vggserve.weights import load_weights

    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(WeightsNotFound, match=r"weights file .*weights is a folder, not a weights file"):
        find_weights(folder)
    with pytest.raises(WeightsNotFound, match=r"weights is a folder, not a weights file"):
        load_weights(folder)
    monkeypatch.setenv("VGGSERVE_WEIGHTS", str(folder))
    with pytest.raises(WeightsNotFound, match=r"VGGSERVE_WEIGHTS=.*weights is a folder, not a weights file"):
        find_weights()
