"""One image's k most probable classes, cheaply: `predictions.top_k` finds the order for a batch (take_along_axis
over (N, k) arrays); for the one row of a request, k argmax calls (small k) or a partition, a comparison count and
a lexsort of the k give the same answer at a fraction of the cost, with the same rule for ties (the lower class
index first, as a stable sort of -p would), and the full stable sort where they could differ (a NaN in the row; a
k-th value tied with one outside the k).

    predictions(p, 5)    # p: (1000,) float32 -> [{"index", "label", "probability"}, ...] == top_k(p, 5)[0]
"""

import numpy as np

from ...labels import imagenet_labels


SMALL_K = 16  # up to this k, k argmax calls beat a partition of the row


def top_k_row(probabilities: np.ndarray, k: int) -> np.ndarray:
    """The k most probable class indices of one row, highest first, the lower index first among ties:
    `np.argsort(-p, kind="stable")[:k]`, without sorting the row."""
    if k <= SMALL_K:
        order = _by_argmax(probabilities, k)
        if order is not None:
            return order
    elif k < probabilities.shape[0]:
        neg = -probabilities
        best = neg.argpartition(k - 1)[:k]
        values = neg[best]
        if np.count_nonzero(neg <= values.max()) == k:  # no tie across the k-th place, no NaN among the k
            return best[np.lexsort((best, values))]
    return np.argsort(-probabilities, kind="stable")[:k]


def _by_argmax(probabilities: np.ndarray, k: int) -> np.ndarray | None:
    """The k best by repeated argmax (the first of equal values, as the stable sort), each taken out as -inf;
    None where that could differ from the stable sort: a NaN in the row, or -inf reached."""
    row = probabilities.copy()
    order = np.empty(min(k, row.shape[0]), np.intp)
    for n in range(order.shape[0]):
        i = row.argmax()
        value = row[i]
        if value != value or value == -np.inf:
            return None
        order[n] = i
        row[i] = -np.inf
    return order


def predictions(probabilities: np.ndarray, k: int) -> list[dict]:
    """[{"index", "label", "probability"}] of the k most probable classes of one row, as `predictions.top_k`."""
    order = top_k_row(probabilities, k)
    labels = imagenet_labels()
    return [{"index": i, "label": labels[i], "probability": p}
            for i, p in zip(order.tolist(), probabilities[order].tolist())]
