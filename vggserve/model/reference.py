"""VGG16 forward pass in float64 numpy: the reference every engine result is checked against."""

import numpy as np

from ..weights.spec import vgg16_spec, infer_width


def conv3x3_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray, relu: bool = True) -> np.ndarray:
    """3x3 convolution, stride 1, zero padding 1, NCHW; im2col with a strided view, then one matmul."""
    n, c, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    s = padded.strides
    cols = np.lib.stride_tricks.as_strided(padded, (n, c, 3, 3, h, wd), (s[0], s[1], s[2], s[3], s[2], s[3]))
    cols = cols.transpose(0, 4, 5, 1, 2, 3).reshape(n * h * wd, c * 9)
    out = cols @ w.reshape(w.shape[0], -1).T + b
    out = out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2)
    return np.maximum(out, 0) if relu else out


def maxpool2x2(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    x = x[:, :, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def reference_logits(tensors: dict[str, np.ndarray], x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Logits (N, 1000) of torchvision-named VGG16 tensors on normalised input x (N, 3, 224, 224)."""
    spec = vgg16_spec(infer_width(tensors))
    a = np.asarray(x, dtype=dtype)
    for conv in spec.convs:
        a = conv3x3_relu(a, tensors[f"{conv.name}.weight"].astype(dtype), tensors[f"{conv.name}.bias"].astype(dtype))
        if conv.pool_after:
            a = maxpool2x2(a)
    a = a.reshape(a.shape[0], -1)
    for fc in spec.fcs:
        a = a @ tensors[f"{fc.name}.weight"].astype(dtype).T + tensors[f"{fc.name}.bias"].astype(dtype)
        if fc.relu:
            a = np.maximum(a, 0)
    return a
