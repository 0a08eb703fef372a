"""Shared fixtures. Generated weights only: published weights cannot be downloaded in CI.

`tiny_weights_path` is VGG16 at width 1/8 (same 16 layers, 224x224 input, 1000 classes, 2.6 M parameters):
every kernel path runs, in a fraction of the time. Full-width VGG16 appears only where the test is about it.
"""

import os

import numpy as np
import pytest


TINY_WIDTH = 0.125
# the OpenCL device the engine tests run on: the CPU (PoCL) here and in CI; `gpu` on a GPU machine
TEST_DEVICE = os.environ.get("VGGSERVE_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_tensors():
    from vggserve.weights.init import init_weights

    return init_weights(seed=0, width=TINY_WIDTH)


@pytest.fixture(scope="session")
def tiny_weights_path(tmp_path_factory, tiny_tensors):
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("weights") / "vgg16-tiny-seed0.safetensors"
    save_file(tiny_tensors, str(path))
    return path


@pytest.fixture(scope="session")
def full_tensors():
    from vggserve.weights.init import init_weights

    return init_weights(seed=0, width=1.0)


@pytest.fixture(scope="session")
def test_device():
    return TEST_DEVICE


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
