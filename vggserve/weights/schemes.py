"""Key schemes: how each source names VGG16's tensors, and the conversion to torchvision names and layouts.

- torchvision: ``features.{0,2,5,...}.weight`` (out, in, 3, 3), ``classifier.{0,3,6}.weight`` (out, in).
- timm (``vgg16.tv_in1k``): the same ``features.*``; the classifier is ``pre_logits.fc1`` = Conv2d(512, 4096, 7)
  with weight (4096, 512, 7, 7), ``pre_logits.fc2`` = Conv2d(4096, 4096, 1) with weight (4096, 4096, 1, 1), and
  ``head.fc`` = Linear(4096, 1000). A 7x7 convolution over the 7x7 feature map is the fully connected layer on
  the (c, h, w)-flattened features, so the weights reshape to (4096, 25088) and (4096, 4096) without reordering.
- keras (``block1_conv1`` ... ``block5_conv3``, ``fc1``, ``fc2``, ``predictions``; readers name them
  ``<layer>.kernel`` / ``<layer>.bias``): conv kernels are HWIO (3, 3, in, out) -> OIHW; dense kernels are
  (in, out) -> transposed; ``fc1``'s input rows follow Keras' channels-last flatten (h, w, c), reordered here to
  torchvision's (c, h, w). Keras convolutions are cross-correlations like torch's: no kernel flip.
"""

import numpy as np

from .spec import POOLED_SIZE, vgg16_spec

KERAS_CONV_LAYERS = (
    "block1_conv1", "block1_conv2", "block2_conv1", "block2_conv2",
    "block3_conv1", "block3_conv2", "block3_conv3", "block4_conv1", "block4_conv2", "block4_conv3",
    "block5_conv1", "block5_conv2", "block5_conv3",
)  # fmt: skip
KERAS_FC_LAYERS = ("fc1", "fc2", "predictions")
KERAS_LAYERS = KERAS_CONV_LAYERS + KERAS_FC_LAYERS

_TV_CONVS = tuple(c.name for c in vgg16_spec(1.0).convs)  # features.0, features.2, ... (the same at any width)
_TV_FCS = ("classifier.0", "classifier.3", "classifier.6")
_TIMM_FCS = ("pre_logits.fc1", "pre_logits.fc2", "head.fc")
_TO_KERAS = dict(zip(_TV_CONVS + _TV_FCS, KERAS_LAYERS))
_TO_TIMM = dict(zip(_TV_FCS, _TIMM_FCS))


def detect_scheme(keys) -> str:
    """"keras", "timm" or "torchvision" (the default: unknown names then show up as missing keys)."""
    keys = set(keys)
    if any(k.split(".")[0] in KERAS_LAYERS for k in keys):
        return "keras"
    if any(k.startswith(("pre_logits.", "head.fc.")) for k in keys):
        return "timm"
    return "torchvision"


def source_name(scheme: str, key: str) -> str:
    """The name a torchvision key has in a file of `scheme`, for error messages."""
    layer, _, kind = key.rpartition(".")
    if scheme == "timm" and layer in _TO_TIMM:
        return f"{_TO_TIMM[layer]}.{kind}"
    if scheme == "keras" and layer in _TO_KERAS:
        return f"{_TO_KERAS[layer]}.{'kernel' if kind == 'weight' else 'bias'}"
    return key


def to_torchvision(raw: dict[str, np.ndarray], scheme: str) -> dict[str, np.ndarray]:
    """Rename and re-layout `raw` tensors of `scheme` to torchvision names; shapes are checked afterwards."""
    if scheme == "timm":
        return _from_timm(raw)
    if scheme == "keras":
        return _from_keras(raw)
    return _strip_prefix(raw, "module.")


def _strip_prefix(raw: dict, prefix: str) -> dict:
    """`module.features.0.weight` (saved from a DataParallel model) -> `features.0.weight`."""
    if raw and all(k.startswith(prefix) for k in raw):
        return {k[len(prefix) :]: v for k, v in raw.items()}
    return dict(raw)


def _from_timm(raw: dict) -> dict:
    renames = {f"{t}.{kind}": f"{tv}.{kind}" for tv, t in _TO_TIMM.items() for kind in ("weight", "bias")}
    out = {}
    for key, arr in raw.items():
        name = renames.get(key, key)
        if name in ("classifier.0.weight", "classifier.3.weight") and arr.ndim == 4:
            arr = arr.reshape(arr.shape[0], -1)  # conv-as-linear: (out, c, kh, kw) -> (out, c*kh*kw)
        out[name] = arr
    return out


def _from_keras(raw: dict) -> dict:
    out = {}
    for key, arr in raw.items():
        layer, _, kind = key.rpartition(".")
        tv_layer = next((tv for tv, k in _TO_KERAS.items() if k == layer), None)
        if tv_layer is None or kind not in ("kernel", "bias"):
            out[key] = arr  # reported as an unexpected key
            continue
        if kind == "bias":
            out[f"{tv_layer}.bias"] = arr
        else:
            out[f"{tv_layer}.weight"] = _keras_kernel(layer, arr)
    return out


def _keras_kernel(layer: str, kernel: np.ndarray) -> np.ndarray:
    if kernel.ndim == 4:  # (kh, kw, in, out) -> (out, in, kh, kw)
        return kernel.transpose(3, 2, 0, 1)
    if kernel.ndim != 2:
        return kernel
    if layer == "fc1" and kernel.shape[0] % (POOLED_SIZE * POOLED_SIZE) == 0:
        channels = kernel.shape[0] // (POOLED_SIZE * POOLED_SIZE)
        hwc = kernel.reshape(POOLED_SIZE, POOLED_SIZE, channels, kernel.shape[1])
        return hwc.transpose(3, 2, 0, 1).reshape(kernel.shape[1], -1)  # columns in (c, h, w) order
    return kernel.T
