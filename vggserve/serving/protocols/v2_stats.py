"""v2's statistics extension (Triton's): GET /v2/models/stats and /v2/models/vgg16[/versions/1]/stats, from the
service's Prometheus metrics (of every process, with HTTP front ends), so tritonclient's
`get_inference_statistics()` and perf_analyzer's server-side figures work.

Every request to the model counts, from either protocol (/classify, /classify/batch, v2 infer), as Triton counts
every request to a model whatever its protocol:

    success, fail        requests answered 200 / anything else, with their time in the server
    queue                per image: from entering the device queue to the start of its batch
    compute_input        per image: decoding and preprocessing
    compute_infer        per image: the device time of the batch it ran in (as Triton gives each request of a batch)
    compute_output       not measured apart (softmax and top-k are in the batch's device time): count, 0 ns
    inference_count      images computed; execution_count: device batches
    batch_stats          per batch size: batches, and their device time in compute_infer (0 ns in compute_input
                         and compute_output)
"""

from ..modelcard import ModelCard

NS = 1e9


def _stat(count: float, seconds: float) -> dict:
    return {"count": int(count), "ns": int(round(seconds * NS))}


def model_statistics(samples: dict[tuple, float], card: ModelCard) -> dict:
    """The model's entry of `model_stats`, from Metrics.samples()."""

    def value(name: str, **labels) -> float:
        return samples.get((name, *sorted(labels.items())), 0.0)

    sizes = sorted(int(key[1][1]) for key in samples
                   if key[0] == "vggserve_batch_inference_seconds_count" and len(key) == 2 and key[1][0] == "size")
    batches = {n: (value("vggserve_batch_inference_seconds_count", size=str(n)),
                   value("vggserve_batch_inference_seconds_sum", size=str(n))) for n in sizes}
    images = sum(n * count for n, (count, _) in batches.items())
    image_seconds = sum(n * seconds for n, (_, seconds) in batches.items())
    outcome = {o: _stat(value("vggserve_request_outcome_seconds_count", outcome=o),
                        value("vggserve_request_outcome_seconds_sum", outcome=o)) for o in ("success", "fail")}
    return {
        "name": card.name, "version": card.version,
        "last_inference": int(value("vggserve_last_inference_timestamp_seconds") * 1000),  # ms since the epoch
        "inference_count": int(images), "execution_count": int(sum(c for c, _ in batches.values())),
        "inference_stats": {
            **outcome,
            "queue": _stat(value("vggserve_queue_seconds_count"), value("vggserve_queue_seconds_sum")),
            "compute_input": _stat(value("vggserve_preprocess_seconds_count"),
                                   value("vggserve_preprocess_seconds_sum")),
            "compute_infer": _stat(images, image_seconds),
            "compute_output": _stat(images, 0.0),
            "cache_hit": _stat(0, 0.0), "cache_miss": _stat(0, 0.0),
        },
        "batch_stats": [{"batch_size": n, "compute_input": _stat(count, 0.0), "compute_infer": _stat(count, seconds),
                         "compute_output": _stat(count, 0.0)} for n, (count, seconds) in batches.items()],
        "memory_usage": [],
    }
