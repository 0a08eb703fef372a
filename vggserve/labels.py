"""The 1000 ImageNet-1k class names in index order, as torchvision ships them for VGG16 (BSD-3-Clause)."""

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    text = resources.files("vggserve").joinpath("data/imagenet_classes.txt").read_text(encoding="utf-8")
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    assert len(labels) == 1000, f"imagenet_classes.txt has {len(labels)} names, expected 1000"
    return labels
