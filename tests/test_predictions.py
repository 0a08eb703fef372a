"""vggserve.predictions: the top-k found for a whole batch at once is a stable full sort's, ties and NaN included, and
the batch job's result lines written from a template are json.dumps's, byte for byte."""

import json

import numpy as np
import pytest

from vggserve.distributed.store import result_line
from vggserve.labels import imagenet_labels
from vggserve.predictions import result_lines, softmax, top_k, top_k_order


def stable_order(probabilities, k):
    return np.argsort(-np.atleast_2d(probabilities), axis=1, kind="stable")[:, :k]


def awkward_scores():
    """Rows with many ties (few distinct values), all equal, signed zeros, NaN and infinities, real softmax rows."""
    rng = np.random.default_rng(0)
    cases = [rng.integers(0, levels, (40, 1000)).astype(np.float32) / levels for levels in (2, 3, 7, 50)]
    zeros = np.zeros((3, 1000), np.float32)
    zeros[1, ::2] = -0.0
    odd = softmax(rng.normal(0, 3, (12, 1000)))
    odd[0, 7] = np.nan
    odd[1, :] = np.nan
    odd[2, :10] = np.nan
    odd[3, 500] = np.inf
    odd[4, 1] = -np.inf
    odd[5, [3, 9, 400]] = odd[5].max()  # a three-way tie for first place
    return cases + [zeros, odd, softmax(rng.normal(0, 3, (1, 1000))), rng.random((3, 7)).astype(np.float32)]


@pytest.mark.parametrize("k", [1, 2, 5, 6, 999, 1000])
def test_top_k_order_is_the_stable_sorts_on_ties_nan_and_infinities(k):
    for scores in awkward_scores():
        kk = min(k, scores.shape[1])
        assert np.array_equal(top_k_order(scores, kk), stable_order(scores, kk)), (scores.shape, kk)


def test_top_k_lists_labels_and_probabilities_of_the_stable_order():
    scores = awkward_scores()[-2]
    labels = imagenet_labels()
    (got,) = top_k(scores, 5)
    want = [{"index": int(i), "label": labels[int(i)], "probability": float(scores[0, i])}
            for i in stable_order(scores, 5)[0]]
    assert got == want and all(type(p["index"]) is int and type(p["probability"]) is float for p in got)
    with pytest.raises(ValueError, match="between 1 and 1000"):
        top_k(scores, 0)


def test_result_lines_are_json_dumps_byte_for_byte():
    """Quotes, backslashes, non-ASCII and undecodable (surrogate-escaped) names, NaN and infinite scores."""
    odd = awkward_scores()[-3]
    images = ['a"b\\c.jpg', "ü/é.jpg", "x\udcffy.jpg", "\n\t.jpg", "plain.jpg", "/abs/p.png"]
    rows = np.concatenate([odd[:4], awkward_scores()[0][:2]])
    labels = imagenet_labels()
    for k in (1, 5):
        want = [json.dumps({"image": image, "predictions": [
            {"index": int(i), "label": labels[int(i)], "probability": float(row[i])} for i in order]})
            for image, row, order in zip(images, rows, stable_order(rows, k))]
        assert result_lines(images, rows, k) == want
        assert want == [result_line(image, preds) for image, preds in zip(images, top_k(rows, k))]


def test_result_lines_refuse_a_count_mismatch():
    with pytest.raises(ValueError, match="2 images for 1 row of probabilities"):
        result_lines(["a", "b"], np.ones((1, 1000), np.float32), 5)


@pytest.mark.parametrize("k", [1, 3, 5, 8, 9])
def test_top_k_order_is_the_stable_sorts_where_few_scores_are_above_minus_infinity_or_nan_hides_among_them(k):
    """Rows with fewer than k scores above -inf (the argmax passes mark their picks with -inf) and NaN anywhere."""
    rng = np.random.default_rng(5)
    scores = (rng.integers(0, 4, (30, 40)) / 3).astype(np.float32)
    scores[:10, 3:] = -np.inf  # three scores above -inf
    scores[10:20, rng.integers(0, 40, 10)] = np.nan
    scores[20:, :] = np.where(rng.random((10, 40)) < 0.5, -np.inf, np.inf)
    for rows in (scores, scores.astype(np.float64), scores.astype(np.float16)):
        assert np.array_equal(top_k_order(rows, k), stable_order(rows, k)), (rows.dtype, k)


def test_result_lines_of_a_whole_chunk_are_json_dumps_byte_for_byte():
    """64 images of real softmax rows and rows with NaN and infinities, every k up to 10."""
    rng = np.random.default_rng(1)
    rows = softmax(rng.normal(0, 3, (64, 1000)))
    rows[5, 17] = np.nan
    rows[9, [4, 800]] = np.inf
    rows[12, :] = -np.inf
    images = [f"/data/photos/{i:03d}-{'ä' * (i % 3)}\"{i}.jpg" for i in range(64)]
    labels = imagenet_labels()
    for k in range(1, 11):
        want = [json.dumps({"image": image, "predictions": [
            {"index": int(i), "label": labels[int(i)], "probability": float(row[i])} for i in order]})
            for image, row, order in zip(images, rows, stable_order(rows, k))]
        assert result_lines(images, rows, k) == want, k
