"""Where published VGG16 weights come from, how to check them, and what they need (one row per source).

`SOURCES` is also the order in which `find_weights` looks for fetched files in the cache folder.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightsSource:
    name: str  # `vggserve weights fetch --source NAME`
    description: str
    url: str  # where the file is published
    file_name: str  # the published file name
    local_name: str  # the name it gets in <cache>/weights/
    sha256: str | None  # full digest when known
    sha256_prefix: str  # what the publisher's file name or listing guarantees
    format: str  # see `sniff.detect_format`
    key_scheme: str  # see `schemes`
    preprocessing: str  # "torchvision" or "caffe"
    licence: str
    hub_repo: str | None = None  # Hugging Face repo id when fetched through huggingface_hub
    fetchable: bool = True
    other_digest: str | None = None  # a digest in another algorithm, as published (e.g. Keras' md5)


TIMM = WeightsSource(
    name="timm",
    description="timm vgg16.tv_in1k: torchvision's ImageNet-1k VGG16 weights, re-published as safetensors",
    url="https://huggingface.co/timm/vgg16.tv_in1k/resolve/main/model.safetensors",
    file_name="model.safetensors",
    local_name="vgg16.tv_in1k.safetensors",
    sha256="57b026918159a6bf9faf8405c3a551903768e7138989d9c6224a14227203fad8",
    sha256_prefix="57b02691",
    format="safetensors",
    key_scheme="timm",
    preprocessing="torchvision",
    licence="BSD-3-Clause (model card of timm/vgg16.tv_in1k); trained on ImageNet-1k, whose terms restrict use",
    hub_repo="timm/vgg16.tv_in1k",
)

TORCHVISION = WeightsSource(
    name="torchvision",
    description="torchvision VGG16_Weights.IMAGENET1K_V1 (legacy torch pickle format)",
    url="https://download.pytorch.org/models/vgg16-397923af.pth",
    file_name="vgg16-397923af.pth",
    local_name="vgg16-397923af.pth",
    sha256=None,  # published only as the 8-digit prefix in the name; recorded in a sidecar once downloaded
    sha256_prefix="397923af",
    format="pth-legacy",
    key_scheme="torchvision",
    preprocessing="torchvision",
    licence="BSD-3-Clause (torchvision); trained on ImageNet-1k, whose terms restrict use",
)

KERAS = WeightsSource(
    name="keras",
    description="Keras applications VGG16, include_top=True (Oxford VGG's Caffe weights, ported)",
    url="https://storage.googleapis.com/tensorflow/keras-applications/vgg16/"
    "vgg16_weights_tf_dim_ordering_tf_kernels.h5",
    file_name="vgg16_weights_tf_dim_ordering_tf_kernels.h5",
    local_name="vgg16_weights_tf_dim_ordering_tf_kernels.h5",
    sha256=None,
    sha256_prefix="",
    format="keras-h5",
    key_scheme="keras",
    preprocessing="caffe",
    licence="CC BY 4.0 (weights released by Oxford VGG); Keras code MIT/Apache-2.0",
    fetchable=False,  # not fetched by vggserve: copy it in by hand (needs `pip install 'vggserve[keras]'`)
    other_digest="md5:64373286793e3c8b2b4e3219cbf3544b",
)

SOURCES: tuple[WeightsSource, ...] = (TIMM, TORCHVISION, KERAS)


def source(name: str) -> WeightsSource:
    for s in SOURCES:
        if s.name == name:
            return s
    raise KeyError(name)
