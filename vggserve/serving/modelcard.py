"""What the service serves, declared once as data: the model's name and version, its inputs and outputs with their
datatypes and shapes (-1: the batch), read by both protocols (/classify and /metadata, and v2's model metadata,
configuration and inference)."""

from dataclasses import dataclass

from ..weights.spec import INPUT_SIZE, NUM_CLASSES


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # v2's names: BYTES, FP32
    shape: tuple[int, ...]  # -1 for the batch
    description: str

    def as_v2(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelCard:
    name: str
    version: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    classes: int

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


VGG16_CARD = ModelCard(
    name="vgg16", version="1", platform="vggserve_opencl", classes=NUM_CLASSES,
    inputs=(
        TensorSpec("image", "BYTES", (-1,), "Encoded image files (JPEG, PNG, WebP, GIF, BMP, TIFF), decoded and "
                   "preprocessed exactly as /classify does."),
        TensorSpec("input", "FP32", (-1, 3, INPUT_SIZE, INPUT_SIZE), "Already normalised model input, channels "
                   "first, as VGG16.logits takes it."),
    ),
    outputs=(
        TensorSpec("logits", "FP32", (-1, NUM_CLASSES), "Pre-softmax scores."),
        TensorSpec("probabilities", "FP32", (-1, NUM_CLASSES), "Softmax of the logits."),
    ),
)
