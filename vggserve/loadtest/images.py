"""The image files a load test posts: read once from a folder, then cycled in a fixed order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import VggserveError
from ..wording import count

CONTENT_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".gif": "image/gif",
}

# images are held in memory; a folder bigger than this is sampled (the first files in name order)
MAX_IMAGES = 2000


@dataclass(frozen=True)
class Image:
    """One file's bytes and the Content-Type it is posted with."""

    name: str
    data: bytes
    content_type: str


class ImageSet:
    """Images from a folder (recursively, by extension), handed out round-robin by request index."""

    def __init__(self, images: list[Image]):
        if not images:
            raise VggserveError("no images to send")
        self.images = images

    @classmethod
    def from_folder(cls, folder: Path, limit: int = MAX_IMAGES) -> "ImageSet":
        """Read every .jpg/.jpeg/.png/.webp/.bmp/.gif file under `folder` (sorted, at most `limit`)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise VggserveError(f"--images {str(folder)!r} is not a folder")
        paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in CONTENT_TYPES)
        if not paths:
            kinds = ", ".join(sorted(CONTENT_TYPES))
            raise VggserveError(f"--images {str(folder)!r} holds no image files ({kinds})")
        images = []
        for path in paths[:limit]:
            data = path.read_bytes()
            if data:
                images.append(Image(str(path.relative_to(folder)), data, CONTENT_TYPES[path.suffix.lower()]))
        if not images:
            raise VggserveError(f"--images {str(folder)!r}: every image file is empty")
        return cls(images)

    def __len__(self) -> int:
        return len(self.images)

    def pick(self, index: int) -> Image:
        """The image for request number `index` (cycles through the set)."""
        return self.images[index % len(self.images)]

    def describe(self) -> str:
        """'12 images, 3.1-148.0 KiB' for the run header."""
        sizes = [len(image.data) / 1024 for image in self.images]
        return f"{count(len(self.images), 'image')}, {min(sizes):.1f}-{max(sizes):.1f} KiB"
