"""The calibration methods' names and defaults, apart from their code: `vggserve calibrate`'s parser reads them
without importing the calibration itself."""

METHODS = ("max", "percentile", "entropy")
DEFAULT_METHOD = "max"  # BENCHMARKS.md, "FP8 accuracy, numpy model (CPU)": as good as any, and it clips nothing
# per precision (BENCHMARKS.md, "Recommendation: INT8 with FP16 in classifier.6"): INT8's uniform grid wants clipping
DEFAULT_METHODS = {"fp8": DEFAULT_METHOD, "int8": "percentile"}
DEFAULT_PERCENTILE = 99.99
