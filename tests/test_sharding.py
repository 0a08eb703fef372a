"""Batch sharding (ShardedModel / worker_loop / run_sharded) under `mpiexec -n 3` against the single-device engine.

tests/mpi_scripts/sharding_check.py does the work on rank 0 and prints a JSON report; rank 2's model is rigged
to raise on pieces of more than 2 rows. (split_counts itself is covered in tests/test_batch_units.py.)
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_scripts.launch import mpiexec, subprocess_env

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).resolve().parent / "mpi_scripts" / "sharding_check.py"


@pytest.fixture(scope="module")
def report(tiny_weights_path, tmp_path_factory):
    done = subprocess.run([*mpiexec(3), sys.executable, str(SCRIPT), str(tiny_weights_path), "1,2,5,7", "2"],
                          cwd=tmp_path_factory.mktemp("sharding"), env=subprocess_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sharded_batches_of_1_2_5_7_over_3_ranks_match_the_single_device_engine(report):
    assert [batch["n"] for batch in report["batches"]] == [1, 2, 5, 7]  # 1 and 2 leave ranks with empty pieces
    for batch in report["batches"]:
        for name in batch.keys() - {"n"}:
            result = batch[name]
            assert result["shape"] == [batch["n"], 1000] and result["dtype"] == "float32"
            assert result["same_argmax"], (batch["n"], name)
            assert result["max_abs_diff"] <= 1e-5, (batch["n"], name, result["max_abs_diff"])
    assert "probabilities" in report["batches"][-1]
    assert report["empty_shape"] == [0, 1000]


def test_sharded_model_describes_all_ranks_like_a_model(report):
    assert report["size"] == 3
    assert report["max_batch_size"] == 3 * 4  # per-rank max_batch_size 4
    assert [info["rank"] for info in report["ranks"]] == [0, 1, 2]
    assert report["device_name"].startswith("3 ranks: ")


def test_a_failing_rank_raises_on_rank_0_naming_it_and_the_next_batch_still_works(report):
    failure = report["failure"]
    assert failure is not None, "the rigged rank's failure did not reach rank 0"
    assert "rank 2" in failure["message"] and "injected failure for a piece of 3 rows" in failure["message"]
    after = report["after_failure"]["logits"]
    assert after["same_argmax"] and after["max_abs_diff"] <= 1e-5
