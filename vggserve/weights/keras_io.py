"""Keras HDF5 weights (``vgg16_weights_tf_dim_ordering_tf_kernels.h5``), through the optional h5py.

Keras 2 ``save_weights`` files hold one group per layer (root attribute ``layer_names``), each with its
datasets under ``<layer>/<layer>/kernel:0`` and ``bias:0`` (Keras 1: ``<layer>_W:0``, ``<layer>_b:0``; whole-model
files put all of that under ``model_weights/``; Keras 3 under ``layers/<layer>/vars/0, 1``). The reader finds
each VGG16 layer group by name anywhere in the file and tells kernel from bias by rank, so all of these work.
Output keys are ``<layer>.kernel`` (HWIO or (in, out), as stored) and ``<layer>.bias``; `schemes` converts them.
"""

from pathlib import Path

import numpy as np

from ..errors import WeightsError
from .schemes import KERAS_LAYERS


def read_keras_h5(path: Path) -> dict[str, np.ndarray]:
    try:
        import h5py
    except ImportError:
        raise WeightsError(
            f"{path}: reading Keras .h5 weights needs h5py: pip install 'vggserve[keras]'"
        ) from None
    try:
        with h5py.File(path, "r") as f:
            groups = _layer_groups(f, h5py)
            if not groups:
                raise WeightsError(f"{path}: no VGG16 layers (block1_conv1 ... predictions) in this HDF5 file")
            out = {}
            for layer, group in groups.items():
                out.update(_layer_tensors(path, layer, group, h5py))
            return out
    except WeightsError:
        raise
    except Exception as exc:  # h5py reports damage as OSError, KeyError, RuntimeError, ...
        raise WeightsError(f"{path}: truncated or unreadable HDF5 file ({type(exc).__name__}: {exc})") from None


def _layer_groups(f, h5py) -> dict:
    """The outermost group named after each VGG16 layer, by layer name."""
    found = {}

    def visit(name, obj):
        base = name.rsplit("/", 1)[-1]
        if isinstance(obj, h5py.Group) and base in KERAS_LAYERS and base not in found:
            found[base] = obj

    f.visititems(visit)
    return found


def _layer_tensors(path: Path, layer: str, group, h5py) -> dict[str, np.ndarray]:
    datasets = []
    group.visititems(lambda _n, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
    if not datasets:
        return {}  # a layer group without weights: reported as a missing key by validation
    kernels = [d for d in datasets if d.ndim >= 2]
    biases = [d for d in datasets if d.ndim == 1]
    if len(kernels) != 1 or len(biases) != 1:
        raise WeightsError(
            f"{path}: {layer}: expected one kernel and one bias, found {len(kernels)} and {len(biases)} datasets"
        )
    return {f"{layer}.kernel": np.asarray(kernels[0][()]), f"{layer}.bias": np.asarray(biases[0][()])}
