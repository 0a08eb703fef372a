"""The tuned-parameter table and `vggserve tune`'s refusals: a damaged or foreign table, a cache folder that cannot be
written, shape lists that select nothing, a shape no candidate computes correctly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vggserve import sparse_tuning, tuning
from vggserve.errors import VggserveError
from vggserve.runtime import devices as devs, params as params_module
from vggserve.runtime.params import conv_params_for, params_for, tuned_file

from conftest import TEST_DEVICE

ROOT = Path(__file__).resolve().parent.parent
LABEL = "Some Device (Some Platform)"
GOOD = {"TM": 32, "TN": 32, "TK": 8, "WM": 2, "WN": 2, "LPAD": 1}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(params_module, "shipped_file", lambda: tmp_path / "shipped.json")
    return tmp_path


FOREIGN = ["[1, 2]", json.dumps({LABEL: "tuned"}), json.dumps({LABEL: {"conv_by_batch": {"x16": {}}}}),
           json.dumps({LABEL: {"conv_by_batch": {"0": {"3x64x224": GOOD}}}}),
           json.dumps({LABEL: {"conv_by_batch": {"16": ["3x64x224"]}}}), "{not json"]


@pytest.mark.parametrize("content", FOREIGN)
def test_a_table_the_engine_cannot_read_is_ignored_not_a_traceback_at_every_start(cache, content):
    plain = params_for("cpu", LABEL)
    tuned_file().write_text(content)
    got = params_for("cpu", LABEL)
    assert got == plain
    assert conv_params_for(got, 3, 64, 224, batch=16) == plain["conv"]


def test_an_unreadable_user_table_leaves_the_shipped_one_in_force(cache):
    shipped = {LABEL: {"conv_by_batch": {"16": {"3x64x224": GOOD}}}}
    (cache / "shipped.json").write_text(json.dumps(shipped))
    tuned_file().write_text("[]")
    assert conv_params_for(params_for("cpu", LABEL), 3, 64, 224, batch=16) == GOOD


@pytest.mark.parametrize("content", FOREIGN)
def test_storing_over_a_table_that_is_not_one_keeps_it_aside_and_stores_the_winners(cache, content):
    tuned_file().write_text(content)
    tuning.store(LABEL, {"3x64x224": GOOD}, batch=16)
    assert conv_params_for(params_for("cpu", LABEL), 3, 64, 224, batch=16) == GOOD
    (aside,) = [p for p in cache.iterdir() if p.name.startswith("tuned.json.unreadable")]
    assert aside.read_text() == content


def test_storing_keeps_other_devices_and_batches(cache):
    tuning.store("Other (P)", {"3x64x224": GOOD}, batch=1)
    tuning.store(LABEL, {"3x64x224": GOOD}, batch=16)
    sparse_tuning.store(LABEL, {"64x64x56": {"sparse_csr": [[0.5, 1.2]]}}, batch=16)
    table = json.loads(tuned_file().read_text())
    assert table["Other (P)"]["conv_by_batch"] == {"1": {"3x64x224": GOOD}}
    assert table[LABEL]["conv_by_batch"] == {"16": {"3x64x224": GOOD}}
    assert table[LABEL]["sparse"]["curves"] == {"16": {"64x64x56": {"sparse_csr": [[0.5, 1.2]]}}}
    assert [p.name for p in cache.iterdir()] == ["tuned.json"]  # no temporary file left beside it


@pytest.mark.parametrize("store", [lambda: tuning.store(LABEL, {"3x64x224": GOOD}, batch=16),
                                   lambda: sparse_tuning.store(LABEL, {"64x64x56": {}}, batch=16)])
def test_a_cache_folder_that_cannot_be_written_is_a_one_line_error(tmp_path, monkeypatch, store):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(VggserveError, match="cannot store the tuned parameters in .*a-file/cache/tuned.json"):
        store()


def vggserve(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vggserve", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.parametrize("shapes,message", [("1x2x3", "unknown shape 1x2x3 at fp32: choose from 3x64x224"),
                                            (" , ", "--shapes names no shape")])
def test_tune_refuses_shapes_that_select_nothing_in_one_line(tmp_path, shapes, message):
    r = vggserve("tune", "--device", TEST_DEVICE, "--batch-size", "1", "--shapes", shapes,
                 env={"VGGSERVE_CACHE_DIR": str(tmp_path)})
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and message in r.stderr, r.stderr
    assert not (tmp_path / "tuned.json").exists()
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], "refused before `tuning ... candidates` is announced"


def test_tune_refuses_sparse_timing_at_tf32_rather_than_timing_fp32(tmp_path):
    r = vggserve("tune", "--device", TEST_DEVICE, "--sparse", "--precision", "tf32", "--dry-run",
                 env={"VGGSERVE_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--sparse" in r.stderr and "tf32" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_shape_no_candidate_computes_correctly_is_left_untuned_and_said(cache, monkeypatch):
    monkeypatch.setitem(tuning.TOLERANCE, "fp32", -1.0)  # every candidate "differs" from the reference
    info = devs.resolve(TEST_DEVICE)
    shapes = [s for s in tuning.layer_shapes(batch=1, width=0.125) if s[0] == "64x64x14"]
    said = []
    winners, trials = tuning.tune(info, devs.cl_device(info), batch=1, limit=2, repeats=1, shapes=shapes,
                                  progress=said.append)
    assert winners == {} and trials and not any(t.ok for t in trials)
    assert any("64x64x14" in line and "no candidate" in line for line in said), said


def test_two_tuners_storing_at_once_keep_both_entries(cache, monkeypatch):
    """One tuner per GPU of a host: the second one's store waits for the first one's, so neither entry is lost.
    The first store dwells between its read and its write until the second has finished (without the lock that
    lost the second one's entry) or a second has passed (with it, the second store is waiting on the lock)."""
    import threading

    second_done, first_reading = threading.Event(), threading.Event()
    read = params_module.read_table

    def slow_read(path):
        table = read(path)
        if threading.current_thread().name == "first":
            first_reading.set()
            second_done.wait(1.0)
        return table

    monkeypatch.setattr(params_module, "read_table", slow_read)
    first = threading.Thread(target=tuning.store, args=("GPU 0 (P)", {"3x64x224": GOOD}, 16), name="first")
    first.start()
    assert first_reading.wait(30)
    tuning.store("GPU 1 (P)", {"3x64x224": GOOD}, batch=16)
    second_done.set()
    first.join(30)
    table = json.loads(tuned_file().read_text())
    assert {"GPU 0 (P)", "GPU 1 (P)"} <= set(table), sorted(table)
