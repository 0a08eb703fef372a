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


# Channels-last float32 forward, one layer at a time through a caller's function: what calibration observes and
# the numpy FP8 model (vggserve/quant/reference.py) computes. Activations are (N, H, W, C); the flatten before
# classifier.0 takes torchvision's (C, H, W) order, so the FC weights are used as they are stored.

def conv3x3_nhwc(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, stride 1, zero padding 1, channels last, no bias: the sum over the nine taps of one
    (N*H*W, C) x (C, K) product each, in x's dtype. x (N, H, W, C), w (K, C, 3, 3) -> (N, H, W, K)."""
    n, h, wd, c = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = None
    for dy in range(3):
        for dx in range(3):
            tap = padded[:, dy:dy + h, dx:dx + wd, :].reshape(-1, c) @ w[:, :, dy, dx].T.astype(x.dtype, copy=False)
            out = tap if out is None else np.add(out, tap, out=out)
    return out.reshape(n, h, wd, w.shape[0])


def maxpool2x2_nhwc(x: np.ndarray) -> np.ndarray:
    n, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2, :]
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def staged_logits(spec, x: np.ndarray, layer, upto: str | None = None, start: str | None = None) -> np.ndarray:
    """VGG16 (`spec`: weights.spec.VGG16Spec) on normalised input x (N, 3, 224, 224) with each convolution and FC
    layer computed by `layer(name, a)`: its input a ((N, H, W, C) for a convolution, (N, F) for an FC layer) ->
    its output before the ReLU. ReLU, pooling and the flatten happen here. `upto`: return that layer's input
    instead of the logits. `start`: begin at that layer, x being its input (what `upto` returns for it)."""
    convs, fcs = list(spec.convs), list(spec.fcs)
    names = [c.name for c in convs] + [f.name for f in fcs]
    if start is not None and start not in names:
        raise ValueError(f"no layer {start} in VGG16; layers: {', '.join(names)}")
    first = names.index(start) if start is not None else 0
    a = np.asarray(x) if start is not None else np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1))
    for conv in convs[first:]:
        if conv.name == upto:
            return a
        a = np.maximum(layer(conv.name, a), 0)
        if conv.pool_after:
            a = maxpool2x2_nhwc(a)
    if first < len(convs):
        a = np.ascontiguousarray(a.transpose(0, 3, 1, 2)).reshape(a.shape[0], int(np.prod(a.shape[1:])))
    for fc in fcs[max(first - len(convs), 0):]:
        if fc.name == upto:
            return a
        a = layer(fc.name, a)
        if fc.relu:
            a = np.maximum(a, 0)
    return a


def dense_layer(tensors: dict[str, np.ndarray], dtype=np.float32):
    """`staged_logits`' layer function for plain arithmetic in `dtype` (float32: what calibration runs)."""
    def layer(name: str, a: np.ndarray) -> np.ndarray:
        w, b = tensors[f"{name}.weight"], tensors[f"{name}.bias"].astype(dtype)
        a = a.astype(dtype, copy=False)
        return (conv3x3_nhwc(a, w) if w.ndim == 4 else a @ w.T.astype(dtype, copy=False)) + b
    return layer
