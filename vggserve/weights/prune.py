"""Magnitude pruning of VGG16 weights (`vggserve weights prune`) and the sparsity of any set of weights.

Patterns:
  unstructured  the smallest |w| are zeroed, exactly round(S * count) of them (ties broken by position, so the
                result is reproducible);
  2:4           in every group of 4 consecutive weights along the input dimension, the 2 smallest |w| are zeroed.
                For a convolution (M, Cin, 3, 3) the groups are 4 consecutive input channels of one tap (ky, kx):
                the order of the tensor-core kernels' K = (ky*3 + kx)*Cpad + ci, whose 2:4 kernel
                (kernels/conv_tc_sparse.cl) needs its chunks of 4 consecutive k to be 2:4. (Groups of 4 in the
                (Cin, 3, 3) flatten order would mix taps and channels, and are not groups in the kernel's order.)
                For a fully connected layer: 4 consecutive in_features. A last group shorter than 4 (conv1's 3
                channels per tap) counts as padded with zeros, as the kernels pad channels, so it keeps its 2
                largest.
Scopes (unstructured only):
  layer   (default) every selected layer loses the same fraction S of its weights;
  global  one magnitude threshold over all selected layers, so the fraction differs per layer.
Per layer is the default because the fraction per layer is what decides which kernel each layer gets and how fast it
runs, and because magnitudes are not comparable across layers: VGG16's weights scale with 1/sqrt(fan_in) (0.27 for
conv1 of generated weights, 0.009 for fc1), so a global threshold at 90% empties the fully connected layers long
before it touches conv1, and without retraining that takes the accuracy down with it (docs/sparse.md).
Biases are never pruned.
"""

import json
from dataclasses import dataclass

import numpy as np

from .spec import infer_width, vgg16_spec

PATTERNS = ("unstructured", "2:4")
LAYER_SETS = ("conv", "fc", "all")
SCOPES = ("layer", "global")


@dataclass
class Pruned:
    tensors: dict[str, np.ndarray]  # every input tensor; the pruned weights are new arrays
    layer_sparsity: dict[str, float]  # layer name ("features.0", ...) -> fraction of its weights that are zero


def weight_layers(tensors: dict, layers: str = "all") -> list[str]:
    """Layer names (torchvision prefixes, network order) of the convolutions, fully connected layers, or both."""
    if layers not in LAYER_SETS:
        raise ValueError(f"layers must be one of {', '.join(LAYER_SETS)}, got {layers!r}")
    spec = vgg16_spec(infer_width(tensors))
    convs = [c.name for c in spec.convs] if layers in ("conv", "all") else []
    return convs + ([f.name for f in spec.fcs] if layers in ("fc", "all") else [])


def sparsity(weight: np.ndarray) -> float:
    """Fraction of the entries that are exactly zero."""
    return 1.0 - np.count_nonzero(weight) / max(weight.size, 1)


def layer_sparsities(tensors: dict) -> dict[str, float]:
    """{layer name: fraction of zero weights} for every conv and fully connected layer, in network order."""
    return {name: sparsity(tensors[f"{name}.weight"]) for name in weight_layers(tensors)}


def is_2_4(weight: np.ndarray) -> bool:
    """Whether every group of 4 (see the module doc; last group of a row zero-padded) has at most 2 non-zeros."""
    groups = _groups_of_4(weight)
    return bool((np.count_nonzero(groups, axis=2) <= 2).all())


def _rows(weight: np.ndarray) -> np.ndarray:
    """The weights as rows whose consecutive 4s are the 2:4 groups: (M, Cin) as they are, (M, Cin, kh, kw) as
    (M * kh * kw, Cin) (input channels of one tap)."""
    w = np.asarray(weight)
    if w.ndim == 4:
        return w.transpose(0, 2, 3, 1).reshape(-1, w.shape[1])
    return w.reshape(w.shape[0], -1)


def _groups_of_4(weight: np.ndarray) -> np.ndarray:
    """(rows, ceil(K/4), 4) of `_rows`, each row zero-padded to a multiple of 4."""
    w2 = _rows(weight)
    k = w2.shape[1]
    padded = np.zeros((w2.shape[0], -(-k // 4) * 4), dtype=w2.dtype)
    padded[:, :k] = w2
    return padded.reshape(w2.shape[0], -1, 4)


def prune_2_4(weight: np.ndarray) -> np.ndarray:
    """A copy of `weight` with the 2 smallest |w| of every group of 4 zeroed (ties: the later one goes)."""
    groups = _groups_of_4(weight)
    order = np.argsort(-np.abs(groups), axis=2, kind="stable")  # per group, largest first
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order[:, :, :2], True, axis=2)
    k = weight.shape[1]
    rows = np.where(keep, groups, 0).reshape(groups.shape[0], -1)[:, :k]
    if weight.ndim == 4:
        m, _, kh, kw = weight.shape
        out = rows.reshape(m, kh, kw, k).transpose(0, 3, 1, 2)
    else:
        out = rows.reshape(weight.shape)
    return np.ascontiguousarray(out, dtype=weight.dtype)


def _smallest(magnitudes: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` smallest entries of a 1-D array; among equal magnitudes the earliest go first."""
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    if count >= magnitudes.size:
        return np.arange(magnitudes.size)
    threshold = np.partition(magnitudes, count - 1)[count - 1]
    below = np.flatnonzero(magnitudes < threshold)
    ties = np.flatnonzero(magnitudes == threshold)[: count - below.size]
    return np.concatenate([below, ties])


def prune_unstructured(weight: np.ndarray, fraction: float) -> np.ndarray:
    """A copy of `weight` with its round(fraction * size) smallest |w| zeroed."""
    flat = np.array(weight, dtype=weight.dtype).reshape(-1)
    flat[_smallest(np.abs(flat), int(round(fraction * flat.size)))] = 0
    return flat.reshape(weight.shape)


def prune_global(weights: list[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Copies of `weights` with the round(fraction * total) smallest |w| over all of them zeroed."""
    sizes = [w.size for w in weights]
    flat = np.concatenate([np.asarray(w, dtype=np.float32).reshape(-1) for w in weights])
    flat[_smallest(np.abs(flat), int(round(fraction * flat.size)))] = 0
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    return [p.reshape(w.shape).astype(w.dtype, copy=False) for p, w in zip(parts, weights)]


def check_options(target: float | None, pattern: str, scope: str) -> float:
    """The sparsity to prune to, with a message that says how to fix a bad combination."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if pattern == "2:4":
        if target not in (None, 0.5):
            raise ValueError(f"--pattern 2:4 always prunes half the weights: give --sparsity 0.5 or leave it out, "
                             f"not {target}")
        if scope != "layer":
            raise ValueError("--pattern 2:4 is per group of 4 weights: --scope global applies to unstructured only")
        return 0.5
    if target is None:
        raise ValueError("--sparsity is required for unstructured pruning (e.g. --sparsity 0.9)")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"--sparsity must be between 0 and 1, got {target}")
    return float(target)


def prune(tensors: dict, target: float | None, pattern: str = "unstructured", layers: str = "all",
          scope: str = "layer") -> Pruned:
    """Magnitude-prune the weights of the selected layers (torchvision-named VGG16 tensors); see the module doc."""
    fraction = check_options(target, pattern, scope)
    names = weight_layers(tensors, layers)
    out = dict(tensors)
    keys = [f"{name}.weight" for name in names]
    if pattern == "2:4":
        pruned = [prune_2_4(tensors[k]) for k in keys]
    elif scope == "global":
        pruned = prune_global([tensors[k] for k in keys], fraction)
    else:
        pruned = [prune_unstructured(tensors[k], fraction) for k in keys]
    out.update(zip(keys, pruned))
    return Pruned(out, layer_sparsities(out))


def provenance(source_name: str, source_sha256: str, source_metadata: dict, target: float, pattern: str,
               layers: str, scope: str, layer_sparsity: dict[str, float], preprocessing: str, width: float) -> dict:
    """The safetensors metadata of a pruned file: where it came from, how it was pruned, and the result."""
    return {
        "source": "vggserve weights prune",
        "source_file": source_name,
        "source_sha256": source_sha256,
        "source_metadata": json.dumps(source_metadata, sort_keys=True),
        "prune_pattern": pattern,
        "prune_sparsity": repr(target),
        "prune_layers": layers,
        "prune_scope": scope,
        "layer_sparsity": json.dumps({k: round(v, 6) for k, v in layer_sparsity.items()}),
        "key_scheme": "torchvision",
        "preprocessing": preprocessing,
        "width": repr(width),
    }
