"""What the benchmark scripts print, checked without running them (compare_torch.py needs torch and a GPU to run)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROW = {"batch": 1, "vggserve_img_s": 2.0, "vggserve_ms": 500.0, "vggserve_kernels_ms": 450.0, "torch_img_s": 4.0,
       "torch_ms": 250.0, "torch_end_to_end_ms": 260.0, "ratio_vggserve_over_torch": 0.5, "ratio_end_to_end": 0.52,
       "max_rel_diff_vs_torch": 1e-6, "vggserve_streamed_img_s": 2.1, "torch_streamed_img_s": 3.9,
       "ratio_streamed": 0.54, "ratio_vggserve_streamed_over_torch_on_gpu": 0.5}


def test_compare_torch_on_the_cpu_reports_no_gpu_copies():
    """`--device cpu` printed "on-GPU input" and "pinned, non-blocking" for a PyTorch that ran on the CPU."""
    compare = load_script("compare_torch")
    text = "\n".join(compare.batch_report(ROW, compare.torch_wording("cpu")))
    assert "GPU" not in text and "pinned" not in text and "non-blocking" not in text
    assert "250.00 ms input in place" in text and "torch (back to back)" in text


def test_compare_torch_on_a_gpu_names_the_resident_input_and_the_pinned_copies():
    compare = load_script("compare_torch")
    text = "\n".join(compare.batch_report(ROW, compare.torch_wording("cuda")))
    assert "250.00 ms on-GPU input" in text and "torch (pinned, non-blocking)" in text
