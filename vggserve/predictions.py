"""From scores to the predictions users see: softmax, top-k with labels, and the batch job's result lines.

    top_k(probabilities, 5)            [[{"index", "label", "probability"}, ...], ...] per row
    result_lines(paths, probabilities, 5)   the JSON lines of results.jsonl, as result_line(path, top_k(...)[i])

Ties are broken towards the lower class index, as a stable sort of -p would, so results are reproducible. The
order is found for a whole batch at once (`top_k_order`): for a small k, k argmax passes over the batch; else a
partition picks each row's k best, and only those k are sorted; rows where either could differ from the full
stable sort (a tie across the k-th place, a NaN, -inf picked) take that sort, so the answer is its answer in every
case. Result lines are written a chunk at a time from templates (`result_lines`).
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
    probs = np.atleast_2d(probabilities)
    rows, classes = probs.shape
    if k <= ARGMAX_K and 0 < rows and k < classes:
        return _top_k_by_argmax(probs, k)
    neg = -probs
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


ARGMAX_K = 8  # top_k_order takes k argmax passes up to this k (a few vector passes beat a partition of every row)


def _top_k_by_argmax(probs: np.ndarray, k: int) -> np.ndarray:
    """top_k_order by k passes of argmax (the first of equal maxima: the lower index among ties), each pass's pick
    then set to -inf; rows where a NaN or -inf was picked (a NaN, or -inf tied with that mark) take the full stable
    sort."""
    work = np.array(probs, dtype=np.float32 if probs.dtype == np.float32 else np.float64)
    order = np.empty((len(work), k), np.intp)
    every = np.arange(len(work))
    odd = np.zeros(len(work), bool)
    for place in range(k):
        order[:, place] = picked = work.argmax(axis=1)
        best = work[every, picked]  # a NaN in a row is its first pick: argmax takes NaN first
        odd |= np.isnan(best) | (best == -np.inf)
        work[every, picked] = -np.inf
    if odd.any():
        order[odd] = np.argsort(-probs[odd], axis=1, kind="stable")[:, :k]
    return order


def _best(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's top_k_order, their probabilities), k checked against the classes."""
    probs = np.atleast_2d(probabilities)
    if not 1 <= k <= probs.shape[1]:
        raise ValueError(f"top_k must be between 1 and {probs.shape[1]}, got {k}")
    order = top_k_order(probs, k)
    return order, np.take_along_axis(probs, order, axis=1)


def top_k(probabilities: np.ndarray, k: int = 5) -> list[list[dict]]:
    """For each row, the k most probable classes, highest first: [{"index", "label", "probability"}]."""
    order, chosen = _best(probabilities, k)
    labels = imagenet_labels()
    return [
        [{"index": i, "label": labels[i], "probability": p} for i, p in zip(idx, values)]
        for idx, values in zip(order.tolist(), chosen.tolist())
    ]


def result_lines(images: list[str], probabilities: np.ndarray, k: int) -> list[str]:
    """The results.jsonl line of each image (row i is images[i]'s): exactly `result_line(image, top_k(row, k)[0])`,
    that is `json.dumps({"image": image, "predictions": [...]})`, written from templates a chunk at a time: each
    class's `{"index": i, "label": ..., "probability": ` made once, every probability of the chunk written by one
    `repr` of a list (Python's float repr, as json.dumps writes it), each path by json's own string encoder."""
    order, chosen = _best(probabilities, k)
    if len(images) != len(order):
        raise ValueError(f"{count(len(images), 'image')} for {count(len(order), 'row')} of probabilities")
    if not len(images):
        return []
    entries = _json_entries(order, chosen)
    quote = _encode_json_string
    return [f'{{"image": {quote(image)}, "predictions": [{"}, ".join(entries[at:at + k])}}}]}}'
            for image, at in zip(images, range(0, len(entries), k))]


def _json_entries(order: np.ndarray, values: np.ndarray) -> list[str]:
    """`{"index": i, "label": ..., "probability": p` (no closing brace) for every (row, place), row by row."""
    heads = _entry_heads()
    floats = repr(values.ravel().tolist())[1:-1].split(", ")  # each as repr(float(v)), in one C loop
    if not np.isfinite(values).all():
        floats = [_NON_FINITE.get(text, text) for text in floats]
    return [heads[i] + text for i, text in zip(order.ravel().tolist(), floats)]


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # as json.dumps writes them
_encode_json_string = json.encoder.encode_basestring_ascii  # json.dumps(str) with its defaults is exactly this


@lru_cache(maxsize=1)
def _entry_heads() -> tuple[str, ...]:
    return tuple(f'{{"index": {i}, "label": {label}, "probability": ' for i, label in enumerate(_json_labels()))


@lru_cache(maxsize=1)
def _json_labels() -> tuple[str, ...]:
    return tuple(json.dumps(label) for label in imagenet_labels())
