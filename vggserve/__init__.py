"""vggserve: VGG16 image classification on our own OpenCL kernels.

    from vggserve import VGG16, preprocess
    model = VGG16.load("weights.safetensors", device="auto")
    model.classify(["cat.jpg"], top_k=5)
"""

__version__ = "0.1.0"
__all__ = ["VGG16", "preprocess", "__version__"]


def __getattr__(name):  # lazy, so `import vggserve` does not load OpenCL
    if name == "VGG16":
        from .model.vgg16 import VGG16

        return VGG16
    if name == "preprocess":
        from .preprocess import preprocess

        return preprocess
    raise AttributeError(f"module 'vggserve' has no attribute {name!r}")
