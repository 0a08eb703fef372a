"""The device probe is remembered after it passes, so warm starts skip its compile; failures are probed again."""

import pyopencl as cl
import pytest

from vggserve.runtime import devices as devs

from conftest import TEST_DEVICE


@pytest.fixture
def device(monkeypatch, tmp_path):
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VGGSERVE_NO_PROGRAM_CACHE", raising=False)
    d = devs.cl_device(devs.resolve(TEST_DEVICE))
    devs._probe_marker(d).unlink(missing_ok=True)  # resolving may have probed (and remembered) it just now
    return d


def counting(monkeypatch, answer=None):
    calls = []

    def probe(d):
        calls.append(d)
        return answer if answer is not None else real(d)

    real = devs._probe
    monkeypatch.setattr(devs, "_probe", probe)
    return calls


def test_a_passed_probe_is_remembered(monkeypatch, device):
    calls = counting(monkeypatch)
    assert devs._probe_once(device) == "" and devs._probe_once(device) == ""
    assert len(calls) == 1 and devs._probe_marker(device).exists()


def test_a_failed_probe_is_probed_again(monkeypatch, device):
    calls = counting(monkeypatch, answer="broken compiler")
    assert devs._probe_once(device) == "broken compiler" and devs._probe_once(device) == "broken compiler"
    assert len(calls) == 2 and not devs._probe_marker(device).exists()


def test_no_cache_means_always_probing(monkeypatch, device):
    monkeypatch.setenv("VGGSERVE_NO_PROGRAM_CACHE", "1")
    calls = counting(monkeypatch)
    devs._probe_once(device)
    devs._probe_once(device)
    assert len(calls) == 2


def test_the_marker_depends_on_the_driver(device):
    class Other:
        platform, name, driver_version = device.platform, device.name, device.driver_version + "-new"

    assert devs._probe_marker(Other()) != devs._probe_marker(device)
    assert isinstance(device, cl.Device)
