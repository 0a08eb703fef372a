"""FP8 (e4m3) on tensor cores: the precision, the devices that run it, and its kernels against numpy.

Kernels run here on PoCL through their exact software model (VGGSERVE_EMULATE_MMA=1, as test_tensorcore.py does):
mma.sync m16n8k32 e4m3 decoded exactly and multiplied in FP32, the e4m3 rounding of the epilogue bit for bit as
quant/e4m3.encode (round to nearest even, saturate to 448).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from vggserve.errors import DeviceError
from vggserve.ops import precision as precisions
from vggserve.runtime import caps as device_caps


def fake_device(cc=None):
    """What caps.of reads of an OpenCL device; cc: NVIDIA's compute capability, or None (not NVIDIA)."""
    return SimpleNamespace(extensions="cl_nv_device_attribute_query" if cc else "", max_compute_units=132,
                           local_mem_size=48 * 1024, max_work_group_size=1024,
                           compute_capability_major_nv=cc and cc[0], compute_capability_minor_nv=cc and cc[1])


@pytest.mark.parametrize("cc, fp8", [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True),
                                     ((10, 0), True), (None, False)])
def test_e4m3_tensor_cores_need_compute_capability_8_9(monkeypatch, cc, fp8):
    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    caps = device_caps.of(fake_device(cc), "gpu", "a GPU")
    assert caps.fp8 is fp8 and caps.tensor_cores is (cc is not None)


def test_the_software_model_runs_fp8_anywhere(monkeypatch):
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    caps = device_caps.of(fake_device(None), "cpu", "a CPU")
    assert caps.fp8 and caps.emulate_mma


def test_a_device_without_e4m3_tensor_cores_refuses_fp8_in_one_line():
    with pytest.raises(DeviceError) as err:
        precisions.check(precisions.FP8, True, "NVIDIA A100", fp8=False)
    message = str(err.value)
    assert "\n" not in message and "cannot run precision fp8" in message and "8.9" in message
    assert message.endswith("this device supports fp32, tf32, fp16")
    precisions.check(precisions.FP8, True, "NVIDIA H100", fp8=True)
    with pytest.raises(DeviceError, match=r"8\.0 or newer\); this device supports fp32, fp16$"):
        precisions.check(precisions.TF32, False, "a CPU")  # tf32's refusal as before


def test_fp8_is_stored_as_bytes_and_is_neither_half_nor_tf32():
    fp8 = precisions.FP8
    assert fp8.itemsize == 1 and fp8.fp8 and fp8.tensor_cores and not fp8.half and not fp8.tf32
    assert precisions.TF32.tf32 and not precisions.FP16.fp8 and not precisions.FP16.tf32
