"""vggserve: VGG16 image classification on our own OpenCL kernels.

    from vggserve import VGG16, preprocess
    model = VGG16.load("weights.safetensors", device="auto")
    model.classify(["cat.jpg"], top_k=5)
"""

__version__ = "0.1.0"
__all__ = ["VGG16", "preprocess", "start_device_discovery", "__version__"]


def start_device_discovery(device: str | None = "auto") -> bool:
    """Start OpenCL's platform discovery (and, for a spec naming the first GPU, its context) in the background,
    before the heavy imports: call it first thing; the model made later finds them ready. See runtime/warmstart.py."""
    from .runtime import warmstart

    return warmstart.start(device)


def __getattr__(name):  # lazy, so `import vggserve` does not load OpenCL
    if name == "VGG16":
        from .model.vgg16 import VGG16

        return VGG16
    if name == "preprocess":
        from .preprocess import preprocess

        return preprocess
    raise AttributeError(f"module 'vggserve' has no attribute {name!r}")
