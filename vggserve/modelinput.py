"""One image on its way to the model, in one of four forms, and the one step that prepares a batch of them.

    form     array                              what is still to do
    encoded  uint8 (n,) the file's bytes, a     decoding on the model's device (`decoding.device.onmodel`, run by
             JPEG the device decoder takes      the service's device worker: `serving.scheduling.devicedecode`)
    image    uint8 (h, w, 3) decoded RGB,       Resize(256) + CenterCrop(224): on the device when the model resizes
             within the aspect-ratio bound      (VGG16.submit), else here (`preprocessing.center_crop`); then as crop
    crop     uint8 (224, 224, 3) RGB            normalisation: on the device (VGG16's pixel input), or here
    tensor   float32 (3, 224, 224)              nothing: normalised already, as `VGG16.logits` takes it

Every path into a model uses it: the service's decoding threads, processes and HTTP front ends, a v2 request's
FP32 `input`, the batch job's decode threads. The shared-memory arena (`ipc.shm`) carries each form as it is.

    x = ModelInput.crop(pixels)
    argument = prepare_batch([x, y, z], mode, resizes=True, takes_pixels=True)   # what one model call takes

The engine's side of the same contract is `check_array` (a stacked batch) and `split_images` (a batch given as a
list of images and crops, for the device resize).
"""

from __future__ import annotations

import logging

import numpy as np
from PIL import Image

from .preprocessing import (CROP_SIZE, aspect_box, center_crop, check_mode, limit_aspect_ratio, normalize_pixels,
                         resized_size)
from .images import to_rgb

IMAGE, CROP, TENSOR, ENCODED = "image", "crop", "tensor", "encoded"
FORMS = (IMAGE, CROP, TENSOR, ENCODED)
DEVICE = "device"  # the form of a `decoding.device.onmodel.DeviceImage`: decoded, in the model's device memory
CROP_SHAPE = (CROP_SIZE, CROP_SIZE, 3)
TENSOR_SHAPE = (3, CROP_SIZE, CROP_SIZE)
#: Decoded images above this size (about 1180 x 1180 RGB) are cropped on the CPU even for a model that resizes on
#: its device: moving them would cost more than their resize saves.
RAW_LIMIT_BYTES = 4 << 20


class ModelInput:
    """One image for the model: `form` (image, crop, tensor or encoded) and its contiguous `array`."""

    __slots__ = ("form", "array")

    def __init__(self, form: str, array: np.ndarray):
        if form == TENSOR:
            array = np.ascontiguousarray(array, dtype=np.float32)
            ok = array.shape == TENSOR_SHAPE
            want = f"float32 {TENSOR_SHAPE}"
        elif form == ENCODED:
            array = np.ascontiguousarray(array, dtype=np.uint8)
            ok = array.ndim == 1 and array.size > 0
            want = "uint8 bytes of shape (n,), n >= 1"
        elif form in (IMAGE, CROP):
            array = np.ascontiguousarray(array, dtype=np.uint8)
            ok = array.shape == CROP_SHAPE if form == CROP else (
                array.ndim == 3 and array.shape[2] == 3 and min(array.shape[:2]) >= 1)
            want = f"uint8 {CROP_SHAPE}" if form == CROP else "uint8 RGB of shape (h, w, 3)"
        else:
            raise ValueError(f"a model input's form is one of {', '.join(FORMS)}, got {form!r}")
        if not ok:
            raise ValueError(f"a model input of form {form} is {want}, got {array.dtype} {array.shape}")
        self.form, self.array = form, array

    @classmethod
    def checked(cls, form: str, array: np.ndarray) -> "ModelInput":
        """An input whose form and array were already checked where it was made (a decode process's answer, its
        pixels seen here through shared memory): no checks or conversions again."""
        made = object.__new__(cls)
        made.form, made.array = form, array
        return made

    @classmethod
    def image(cls, pixels: np.ndarray) -> "ModelInput":
        return cls(IMAGE, pixels)

    @classmethod
    def crop(cls, pixels: np.ndarray) -> "ModelInput":
        return cls(CROP, pixels)

    @classmethod
    def tensor(cls, x: np.ndarray) -> "ModelInput":
        return cls(TENSOR, x)

    @classmethod
    def encoded(cls, data: bytes) -> "ModelInput":
        """An encoded file (bytes), for a model that decodes it on its device."""
        return cls(ENCODED, np.frombuffer(data, np.uint8))

    @property
    def data(self) -> bytes:
        """The file's bytes of an encoded input."""
        if self.form != ENCODED:
            raise ValueError(f"a {self.form} model input has no encoded bytes")
        return self.array.tobytes()

    def __reduce__(self):  # pickles as its form and array (sent between processes)
        return ModelInput, (self.form, self.array)

    def __repr__(self) -> str:
        return f"ModelInput({self.form}, {self.array.dtype} {self.array.shape})"

    @property
    def pixels(self) -> np.ndarray:
        """The uint8 pixels of an image or a crop."""
        if self.form == TENSOR:
            raise ValueError("a tensor model input has no pixels")
        self._check_decoded()
        return self.array

    @property
    def needs_resize(self) -> bool:
        """Whether Resize(256) changes this image (crops and tensors: never)."""
        if self.form != IMAGE:
            return False
        height, width = self.array.shape[:2]
        return resized_size(width, height) != (width, height)

    def cropped(self) -> "ModelInput":
        """An image's centre crop computed here, on the CPU (`preprocessing.center_crop`); crops and tensors as they
        are."""
        self._check_decoded()
        if self.form != IMAGE:
            return self
        return ModelInput(CROP, center_crop(Image.fromarray(self.array, "RGB")))

    def as_tensor(self, mode: str) -> np.ndarray:
        """The float32 (3, 224, 224) model input: an image cropped and a crop normalised here, as `preprocess` does."""
        if self.form == TENSOR:
            return self.array
        self._check_decoded()
        return normalize_pixels(self.cropped().array, mode)

    def _check_decoded(self) -> None:
        if self.form == ENCODED:
            raise ValueError("an encoded model input is decoded before its batch is prepared (on the model's device: "
                             "serving.scheduling.devicedecode)")


def raw_rgb(img: Image.Image | np.ndarray) -> ModelInput:
    """The RGB, aspect-limited image that `center_crop` would resize, as an image input for the engine; uint8 RGB
    pixels (h, w, 3) become one over the same memory (cut to the aspect bound if need be)."""
    if isinstance(img, np.ndarray):
        box = aspect_box(img.shape[1], img.shape[0])
        return ModelInput.image(img if box is None else img[box[1]:box[3], box[0]:box[2]])
    return ModelInput.image(np.asarray(limit_aspect_ratio(to_rgb(img)), dtype=np.uint8))


def device_input(img: Image.Image | np.ndarray) -> ModelInput:
    """What a model that resizes on its device should get for a PIL image (or uint8 RGB pixels): the image when
    Resize(256) changes it and its decoded pixels fit RAW_LIMIT_BYTES, else the uint8 centre crop made here."""
    raw = raw_rgb(img)
    height, width = raw.array.shape[:2]
    return raw if goes_raw(width, height) else raw.cropped()


def goes_raw(width: int, height: int) -> bool:
    """Whether `device_input` sends an RGB image of this size (within the aspect bound) as it is, an image input."""
    return resized_size(width, height) != (width, height) and width * height * 3 <= RAW_LIMIT_BYTES


def uses_device_resize(model) -> bool:
    """Whether `model` resizes on its device with the installed Pillow's results (checked on the device once per
    call; a mismatch is logged, and the caller then crops on the CPU)."""
    if not getattr(model, "resizes_on_device", False):
        return False
    check = getattr(model, "resize_matches_pillow", None)
    if check is not None and not check():
        logging.getLogger("vggserve").warning(
            "the device resize of %s does not match this Pillow's; images are resized on the CPU instead",
            getattr(model, "device_name", "the model"))
        return False
    return True


def prepare_batch(inputs: list[ModelInput], mode: str, *, resizes: bool = False, takes_pixels: bool = False):
    """The one argument of a model call for a batch of inputs, each kept in the cheapest form the model takes:

    - the list itself (images and crops), when the model `resizes` images on its device (`VGG16.submit`), some
      image needs a resize and no input is a tensor;
    - uint8 crops (N, 224, 224, 3), images cropped here, when the model `takes_pixels` (normalises on its device)
      and no input is a tensor;
    - else float32 tensors (N, 3, 224, 224): images cropped and crops normalised here, exactly as `preprocess`.
    A batch that mixes tensors with images therefore runs as tensors, all prepared on the CPU.
    Images decoded on the device (form "device", `DeviceImage`) go as the list too: the model's submit resizes
    them there; such a batch takes no tensors, and encoded inputs are decoded before (ValueError)."""
    check_mode(mode)
    if not inputs:
        raise ValueError("a batch needs at least one input")
    if any(x.form == ENCODED for x in inputs):
        raise ValueError("an encoded model input is decoded before its batch is prepared (on the model's device: "
                         "serving.scheduling.devicedecode)")
    if any(x.form == DEVICE for x in inputs):
        if any(x.form == TENSOR for x in inputs) or not takes_pixels:
            raise ValueError("images decoded on the device go to a model's submit with images and crops, not tensors")
        return list(inputs)
    if any(x.form == TENSOR for x in inputs) or not takes_pixels:
        return np.stack([x.as_tensor(mode) for x in inputs])
    if resizes and any(x.needs_resize for x in inputs):
        return list(inputs)
    return np.stack([x.cropped().array for x in inputs])


def check_array(x: np.ndarray) -> np.ndarray:
    """A stacked batch as a model takes it: uint8 (N, 224, 224, 3) crops as they are, anything else as contiguous
    float32 (N, 3, 224, 224)."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        if x.ndim != 4 or x.shape[1:] != CROP_SHAPE:
            raise ValueError(f"expected uint8 pixels of shape (N, {CROP_SIZE}, {CROP_SIZE}, 3), got {x.shape}")
        return np.ascontiguousarray(x)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 4 or x.shape[1:] != TENSOR_SHAPE:
        raise ValueError(f"expected input of shape (N, 3, {CROP_SIZE}, {CROP_SIZE}), got {x.shape}")
    return x


TENSOR_INPUT = f"normalised float32 (N, 3, {CROP_SIZE}, {CROP_SIZE})"
CROP_INPUT = f"uint8 RGB crops (N, {CROP_SIZE}, {CROP_SIZE}, 3)"


def check_form(x, pixels: bool, name: str, other: str) -> np.ndarray:
    """`check_array` for a function `name` that takes one form: uint8 crops if `pixels`, else float tensors. The
    error names the form `name` takes and the function `other` that takes the form given."""
    x = np.asarray(x)
    shape = CROP_SHAPE if pixels else TENSOR_SHAPE
    if (x.dtype == np.uint8) != pixels or x.ndim != 4 or x.shape[1:] != shape:
        want, other_want = (CROP_INPUT, TENSOR_INPUT) if pixels else (TENSOR_INPUT, CROP_INPUT)
        raise ValueError(f"{name} takes {want}, got {x.dtype} {x.shape}; for {other_want} use {other}")
    return check_array(x)


def split_images(images) -> tuple[dict, list]:
    """A batch given as a list of image and crop inputs (bare uint8 crops too) -> ({index: uint8 crop},
    [(index, image pixels)]): images that need a resize go to the device resize, the others are cropped here (a
    crop of an image that keeps its size is a slice)."""
    crops, raws = {}, []
    for i, image in enumerate(images):
        if isinstance(image, ModelInput):
            if image.form == TENSOR:
                raise ValueError(f"image {i} of the batch is a tensor; a batch of images takes images and crops")
            if image.needs_resize:
                raws.append((i, image.array))
                continue
            image = image.cropped().array
        crop = np.asarray(image)
        if crop.dtype != np.uint8 or crop.shape != CROP_SHAPE:
            raise ValueError(f"image {i} of the batch: expected a uint8 {CROP_SHAPE} crop or an image input, got "
                             f"{crop.dtype} {crop.shape}")
        crops[i] = crop
    return crops, raws
