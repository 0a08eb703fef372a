"""VGG16's architecture as data: layer order, torchvision key names and shapes.

torchvision's VGG16 (configuration "D"):

    features:   conv3-64  conv3-64  pool | conv3-128 conv3-128 pool | conv3-256 x3 pool
                | conv3-512 x3 pool | conv3-512 x3 pool                      -> 512 x 7 x 7
    classifier: fc 25088->4096 relu | fc 4096->4096 relu | fc 4096->1000     (dropout is identity at eval)

Keys are ``features.{i}.weight``/``.bias`` for the 13 convolutions (i = 0, 2, 5, ...) and
``classifier.{0,3,6}.weight``/``.bias``; conv weights are (out, in, 3, 3), fc weights (out, in).

``width`` scales every channel count and the hidden fc size (width 1 is VGG16 itself). Reduced widths exist
for fast tests of everything around the engine; the layer structure, the 224x224 input and the 1000 classes
stay, so every kernel path is exercised. Every layer's channels are a whole multiple of the first convolution's
(`scaled`), so a file's width is known from ``features.0`` alone: a width is snapped to a multiple of 1/64
(`snap_width`), the same way when weights are made (`vggserve weights init`) and when they are loaded.
"""

from dataclasses import dataclass

CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
NUM_CLASSES = 1000
INPUT_SIZE = 224
POOLED_SIZE = 7
HIDDEN = 4096


@dataclass(frozen=True)
class ConvSpec:
    name: str  # torchvision key prefix, e.g. "features.0"
    cin: int
    cout: int
    pool_after: bool  # a 2x2 max pool follows this convolution


@dataclass(frozen=True)
class FcSpec:
    name: str  # e.g. "classifier.0"
    fin: int
    fout: int
    relu: bool


@dataclass(frozen=True)
class VGG16Spec:
    width: float
    convs: tuple[ConvSpec, ...]
    fcs: tuple[FcSpec, ...]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every torchvision key with its expected shape."""
        out: dict[str, tuple[int, ...]] = {}
        for c in self.convs:
            out[f"{c.name}.weight"] = (c.cout, c.cin, 3, 3)
            out[f"{c.name}.bias"] = (c.cout,)
        for f in self.fcs:
            out[f"{f.name}.weight"] = (f.fout, f.fin)
            out[f"{f.name}.bias"] = (f.fout,)
        return out

    @property
    def parameter_count(self) -> int:
        total = 0
        for shape in self.shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


BASE = CONFIG_D[0]  # features.0's output channels at width 1; every channel count above is a multiple of it


def base_channels(width: float) -> int:
    """features.0's output channels at `width`: the nearest whole number to 64 * width, at least 1."""
    return max(1, int(round(BASE * width)))


def snap_width(width: float) -> float:
    """The width a network of `width` really has: base_channels(width) / 64 (0.1 -> 0.09375; 0.125 stays)."""
    return base_channels(width) / BASE


def scaled(channels: int, width: float) -> int:
    """A layer's channels (64, 128, ..., 4096 at width 1) at `width`: a whole multiple of base_channels(width).

    The one rule for init and loader alike; rounding each layer on its own would give channel counts that the
    width read back from features.0 does not reproduce (0.1: 13 = round(12.8) against 12 = 2 * round(6.4)).
    """
    return base_channels(width) * (channels // BASE)


def vgg16_spec(width: float = 1.0) -> VGG16Spec:
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    width = snap_width(width)
    convs: list[ConvSpec] = []
    cin, index = 3, 0
    for j, item in enumerate(CONFIG_D):
        if item == "M":
            index += 1
            continue
        cout = scaled(item, width)
        pool_after = j + 1 < len(CONFIG_D) and CONFIG_D[j + 1] == "M"
        convs.append(ConvSpec(f"features.{index}", cin, cout, pool_after))
        cin = cout
        index += 2  # conv and its ReLU
    hidden = scaled(HIDDEN, width)
    fcs = (
        FcSpec("classifier.0", cin * POOLED_SIZE * POOLED_SIZE, hidden, True),
        FcSpec("classifier.3", hidden, hidden, True),
        FcSpec("classifier.6", hidden, NUM_CLASSES, False),
    )
    return VGG16Spec(width, tuple(convs), fcs)


def infer_width(tensors: dict) -> float:
    """The width of a set of torchvision-named tensors, read from the first convolution's output channels."""
    first = tensors.get("features.0.weight")
    if first is None:
        return 1.0
    return first.shape[0] / BASE
