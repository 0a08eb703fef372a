"""From scores to the predictions users see: softmax and top-k with labels."""

import numpy as np

from .labels import imagenet_labels


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 for stability, returned as float32."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def top_k(probabilities: np.ndarray, k: int = 5) -> list[list[dict]]:
    """For each row, the k most probable classes, highest first: [{"index", "label", "probability"}]."""
    probs = np.atleast_2d(probabilities)
    if not 1 <= k <= probs.shape[1]:
        raise ValueError(f"top_k must be between 1 and {probs.shape[1]}, got {k}")
    labels = imagenet_labels()
    # stable sort on -p keeps the lower index first among ties, so results are reproducible
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return [
        [{"index": int(i), "label": labels[int(i)], "probability": float(row[i])} for i in idx]
        for row, idx in zip(probs, order)
    ]
