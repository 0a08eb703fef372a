"""A damaged file of any format is a WeightsError naming the file: never another exception, never a hang."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from vggserve.errors import WeightsError
from vggserve.weights import load_weights


def _safetensors(path, tensors, rng):
    save_file(tensors, str(path))


def _npz(path, tensors, rng):
    with open(path, "wb") as f:
        np.savez(f, **tensors)


def _pth_zip(path, tensors, rng):
    from test_weights_pth import state_dict, write_zip

    write_zip(path, *state_dict(tensors))


def _pth_legacy(path, tensors, rng):
    from test_weights_pth import state_dict, write_legacy

    write_legacy(path, *state_dict(tensors))


def _keras(path, tensors, rng):
    from test_weights_formats import keras_weights, write_keras_h5

    write_keras_h5(path, keras_weights(tensors, rng))


BUILDERS = {"safetensors": _safetensors, "npz": _npz, "pth-zip": _pth_zip, "pth-legacy": _pth_legacy,
            "keras-h5": _keras}


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_every_truncation_point_is_a_weights_error(tmp_path, tiny_tensors, rng, fmt):
    whole = tmp_path / "whole"
    BUILDERS[fmt](whole, tiny_tensors, rng)
    assert load_weights(whole).format == fmt
    data = whole.read_bytes()
    for i, cut in enumerate([1, 7, 9, 64, 300, 4096, *np.linspace(5000, len(data) - 1, 8).astype(int)]):
        path = tmp_path / f"cut{i}"
        path.write_bytes(data[:cut])
        with pytest.raises(WeightsError) as info:
            load_weights(path)
        assert str(info.value).startswith(str(path)), (cut, str(info.value))
        assert "\n" not in str(info.value)
