"""vggserve: VGG16 image classification on our own OpenCL kernels.

    from vggserve import VGG16, preprocess
    model = VGG16.load("weights.safetensors", device="auto")
    model.classify(["cat.jpg"], top_k=5)

`vggserve.preprocess` is the function; the module that holds it and its helpers is `vggserve.preprocessing`.
"""

import sys
import types

__version__ = "0.1.0"
__all__ = ["VGG16", "preprocess", "start_device_discovery", "__version__"]

# public functions that share their name with a submodule (vggserve/preprocess.py, the module's old name)
_FUNCTIONS_NAMED_LIKE_MODULES = frozenset({"preprocess"})


class _Package(types.ModuleType):
    """The package object. After loading a submodule, the import system binds it on its package under its short
    name; for `vggserve.preprocess` that binding would hide the public function of the same name (in whichever
    order things were imported). The package refuses that one binding, so `vggserve.preprocess` and
    `from vggserve import preprocess` are always the function."""

    def __setattr__(self, name, value):
        if name in _FUNCTIONS_NAMED_LIKE_MODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
        from .preprocessing import preprocess

        globals()["preprocess"] = preprocess
        return preprocess
    raise AttributeError(f"module 'vggserve' has no attribute {name!r}")
