"""The calibration methods' names and defaults, apart from their code: `vggserve calibrate`'s parser reads them
without importing the calibration itself."""

METHODS = ("max", "percentile", "entropy")
DEFAULT_METHOD = "max"  # BENCHMARKS.md, "FP8 accuracy, numpy model (CPU)": as good as any, and it clips nothing
DEFAULT_PERCENTILE = 99.99
