"""Bar chart of a compare_torch.py JSON: images/s per batch for vggserve and PyTorch, as a PNG.

    python benchmarks/plot_compare.py docs/benchmarks/compare_h100_f4x4.json docs/benchmarks/compare_h100_f4x4.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SERIES = [("vggserve_img_s", "vggserve, host to host"), ("vggserve_streamed_img_s", "vggserve, streamed"),
          ("torch_img_s", "PyTorch/cuDNN, input on the GPU"), ("torch_streamed_img_s", "PyTorch/cuDNN, streamed")]


def main(src: str, dst: str) -> None:
    data = json.load(open(src))
    rows = data["batches"]
    x = np.arange(len(rows))
    width = 0.2
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (key, label) in enumerate(SERIES):
        values = [r.get(key, 0) for r in rows]
        bars = ax.bar(x + (i - 1.5) * width, values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(x, [f"batch {r['batch']}" for r in rows])
    ax.set_ylabel("images/s")
    ax.set_title(f"VGG16, FP32 with TF32 off, {data['device'].split(' (')[0]}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
