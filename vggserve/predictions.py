"""From scores to the predictions users see: softmax, top-k with labels, and the batch job's result lines.

    top_k(probabilities, 5)            [[{"index", "label", "probability"}, ...], ...] per row
    result_lines(paths, probabilities, 5)   the JSON lines of results.jsonl, as result_line(path, top_k(...)[i])

Ties are broken towards the lower class index, as a stable sort of -p would, so results are reproducible. The
order is found for a whole batch at once (`top_k_order`): a partition picks each row's k best, and only those k are
sorted; rows where the k-th value is tied with a value outside the k (or that hold a NaN) take the full stable
sort, so the answer is the full sort's in every case.
"""

import json
from functools import lru_cache

import numpy as np

from .labels import imagenet_labels
from .wording import count


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 for stability, returned as float32."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def top_k_order(probabilities: np.ndarray, k: int) -> np.ndarray:
    """(N, k) class indices of each row's k most probable, highest first, the lower index first among ties:
    `np.argsort(-p, axis=1, kind="stable")[:, :k]`, without sorting whole rows."""
    neg = -np.atleast_2d(probabilities)
    rows, classes = neg.shape
    if k >= classes or rows == 0:
        return np.argsort(neg, axis=1, kind="stable")[:, :k]
    best = np.sort(np.argpartition(neg, k - 1, axis=1)[:, :k], axis=1)  # each row's k best, by index
    values = np.take_along_axis(neg, best, axis=1)
    kth = values.max(axis=1, keepdims=True)  # NaN when a NaN is among them
    order = np.take_along_axis(best, np.argsort(values, axis=1, kind="stable"), axis=1)
    unsure = np.count_nonzero(neg <= kth, axis=1) != k  # a tie across the k-th place, or a NaN picked
    if unsure.any():
        order[unsure] = np.argsort(neg[unsure], axis=1, kind="stable")[:, :k]
    return order


def _best(probabilities: np.ndarray, k: int) -> tuple[int, list[list[int]], list[list[float]]]:
    """(rows, each row's top_k_order, their probabilities as Python floats), k checked against the classes."""
    probs = np.atleast_2d(probabilities)
    if not 1 <= k <= probs.shape[1]:
        raise ValueError(f"top_k must be between 1 and {probs.shape[1]}, got {k}")
    order = top_k_order(probs, k)
    return len(probs), order.tolist(), np.take_along_axis(probs, order, axis=1).tolist()


def top_k(probabilities: np.ndarray, k: int = 5) -> list[list[dict]]:
    """For each row, the k most probable classes, highest first: [{"index", "label", "probability"}]."""
    _, order, chosen = _best(probabilities, k)
    labels = imagenet_labels()
    return [
        [{"index": i, "label": labels[i], "probability": p} for i, p in zip(idx, values)]
        for idx, values in zip(order, chosen)
    ]


def result_lines(images: list[str], probabilities: np.ndarray, k: int) -> list[str]:
    """The results.jsonl line of each image (row i is images[i]'s): exactly `result_line(image, top_k(row, k)[0])`,
    that is `json.dumps({"image": image, "predictions": [...]})`, written from a template."""
    rows, order, chosen = _best(probabilities, k)
    if len(images) != rows:
        raise ValueError(f"{count(len(images), 'image')} for {count(rows, 'row')} of probabilities")
    labels = _json_labels()
    lines = []
    for image, idx, values in zip(images, order, chosen):
        entries = ", ".join(f'{{"index": {i}, "label": {labels[i]}, "probability": {_json_float(p)}}}'
                            for i, p in zip(idx, values))
        lines.append(f'{{"image": {json.dumps(image)}, "predictions": [{entries}]}}')
    return lines


@lru_cache(maxsize=1)
def _json_labels() -> tuple[str, ...]:
    return tuple(json.dumps(label) for label in imagenet_labels())


def _json_float(value: float) -> str:
    """A float as json.dumps writes it: repr, and NaN / Infinity / -Infinity for the others."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)
