"""torch .pth checkpoints read without torch: zip and legacy formats, built here with plain pickle.

The builder writes the same bytes torch.save does for a state dict: tensors pickled as calls to
``torch._utils._rebuild_tensor_v2`` over persistent-id storages (``torch.FloatStorage``), whose raw bytes go to
``<folder>/data/<key>`` (zip) or after the pickles, each behind an 8-byte element count (legacy).
"""

import collections
import io
import os
import pickle
import zipfile

import numpy as np
import pytest

from vggserve.errors import WeightsError
from vggserve.weights import load_weights

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _torch_global(module, name):
    """A class that our pickler writes as the GLOBAL `module.name`, without torch being importable."""
    return type(name, (), {"__module__": module, "__qualname__": name, "_torch_global": True})


REBUILD_V2 = _torch_global("torch._utils", "_rebuild_tensor_v2")
REBUILD_V1 = _torch_global("torch._utils", "_rebuild_tensor")
REBUILD_PARAM = _torch_global("torch._utils", "_rebuild_parameter")
STORAGE_TYPES = {np.float32: _torch_global("torch", "FloatStorage"), np.float16: _torch_global("torch", "HalfStorage"),
                 "cuda": _torch_global("torch.cuda", "FloatStorage")}


class Storage:
    def __init__(self, key, data: np.ndarray):
        self.key, self.data = key, np.ascontiguousarray(data).reshape(-1)


class Tensor:
    """A strided tensor over a Storage, reduced the way torch reduces a tensor (v1, v2 or as a Parameter)."""

    def __init__(self, storage, offset, size, stride, style="v2"):
        self.storage, self.offset, self.size, self.stride, self.style = storage, offset, size, stride, style

    def __reduce__(self):
        if self.style == "v1":
            return REBUILD_V1, (self.storage, self.offset, self.size, self.stride)
        inner = (REBUILD_V2, (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict()))
        if self.style == "parameter":
            return REBUILD_PARAM, (Tensor(self.storage, self.offset, self.size, self.stride), True,
                                   collections.OrderedDict())
        return inner


class TorchPickler(pickle._Pickler):
    """Pure-Python pickler that writes our fake torch globals and storages as persistent ids."""

    cuda = False  # write storages as torch.cuda.FloatStorage on "cuda:0", as a checkpoint saved from a GPU

    def __init__(self, file, legacy):
        super().__init__(file, protocol=2)
        self.legacy = legacy

    def save_global(self, obj, name=None):
        if getattr(obj, "_torch_global", False):
            self.write(pickle.GLOBAL + f"{obj.__module__}\n{obj.__qualname__}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            kind = "cuda" if self.cuda else obj.data.dtype.type
            pid = ("storage", STORAGE_TYPES[kind], obj.key, "cuda:0" if self.cuda else "cpu", obj.data.size)
            return pid + (None,) if self.legacy else pid
        return None


def state_dict(tensors, dtype=np.float32, style="v2"):
    """(OrderedDict of Tensors, storages by key): one contiguous storage per tensor, like model.state_dict()."""
    sd, storages = collections.OrderedDict(), {}
    for i, (name, arr) in enumerate(tensors.items()):
        st = Storage(str(i), arr.astype(dtype))
        storages[st.key] = st
        stride = tuple(int(s) for s in np.cumprod((arr.shape[1:] + (1,))[::-1])[::-1]) if arr.ndim else ()
        sd[name] = Tensor(st, 0, tuple(arr.shape), stride, style)
    return sd, storages


def write_zip(path, sd, storages, folder="archive", compression=zipfile.ZIP_STORED, pickled=None):
    buf = io.BytesIO()
    if pickled is None:
        TorchPickler(buf, legacy=False).dump(sd)
        pickled = buf.getvalue()
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        zf.writestr(f"{folder}/data.pkl", pickled)
        zf.writestr(f"{folder}/byteorder", "little")
        for key, st in storages.items():
            zf.writestr(f"{folder}/data/{key}", st.data.tobytes())
        zf.writestr(f"{folder}/version", "3\n")
    return path


def write_legacy(path, sd, storages, pickled=None, protocol=2):
    with open(path, "wb") as f:
        for header in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                            "type_sizes": {"short": 2, "int": 4, "long": 8}}):
            pickle.dump(header, f, protocol=protocol)
        if pickled is None:
            pickler = TorchPickler(f, legacy=True)
            pickler.proto = protocol
            pickler.dump(sd)
        else:
            f.write(pickled)
        keys = sorted(storages)
        pickle.dump(keys, f, protocol=protocol)
        for key in keys:
            data = storages[key].data
            f.write(np.int64(data.size).astype("<i8").tobytes())
            f.write(data.astype(data.dtype.newbyteorder("<")).tobytes())
    return path


WRITERS = {"pth-zip": write_zip, "pth-legacy": write_legacy}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("style", ["v2", "v1", "parameter"])
def test_pth_checkpoint_loads_exact_tensors_without_torch(tmp_path, tiny_tensors, fmt, style):
    sd, storages = state_dict(tiny_tensors, style=style)
    path = WRITERS[fmt](tmp_path / "vgg16.pth", sd, storages)
    w = load_weights(path)
    assert (w.format, w.key_scheme, w.preprocessing, w.width) == (fmt, "torchvision", "torchvision", 0.125)
    assert w.tensors.keys() == tiny_tensors.keys()
    for key, arr in tiny_tensors.items():
        np.testing.assert_array_equal(w.tensors[key], arr)
        assert w.tensors[key].dtype == np.float32 and w.tensors[key].flags.c_contiguous


def test_zip_checkpoint_with_other_folder_name_and_compression_loads(tmp_path, tiny_tensors):
    sd, storages = state_dict(tiny_tensors)
    path = write_zip(tmp_path / "x.pth", sd, storages, folder="vgg16", compression=zipfile.ZIP_DEFLATED)
    w = load_weights(path)
    np.testing.assert_array_equal(w.tensors["classifier.6.weight"], tiny_tensors["classifier.6.weight"])


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_strided_views_into_shared_storage_are_rebuilt(tmp_path, tiny_tensors, fmt):
    """classifier.6.weight stored transposed (stride (1, out)) at an offset inside a storage shared with its bias."""
    w6, b6 = tiny_tensors["classifier.6.weight"], tiny_tensors["classifier.6.bias"]
    sd, storages = state_dict({k: v for k, v in tiny_tensors.items() if not k.startswith("classifier.6")})
    shared = Storage("shared", np.concatenate([b6, np.ascontiguousarray(w6.T).reshape(-1)]))
    storages["shared"] = shared
    sd["classifier.6.bias"] = Tensor(shared, 0, b6.shape, (1,))
    sd["classifier.6.weight"] = Tensor(shared, b6.size, w6.shape, (1, w6.shape[0]))
    w = load_weights(WRITERS[fmt](tmp_path / "v.pth", sd, storages))
    np.testing.assert_array_equal(w.tensors["classifier.6.weight"], w6)
    np.testing.assert_array_equal(w.tensors["classifier.6.bias"], b6)
    assert w.tensors["classifier.6.weight"].flags.c_contiguous


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_half_precision_storages_widen_to_float32(tmp_path, tiny_tensors, fmt):
    sd, storages = state_dict(tiny_tensors, dtype=np.float16)
    w = load_weights(WRITERS[fmt](tmp_path / "h.pth", sd, storages))
    np.testing.assert_array_equal(w.tensors["features.0.weight"],
                                  tiny_tensors["features.0.weight"].astype(np.float16).astype(np.float32))
    assert w.tensors["features.0.weight"].dtype == np.float32


def test_training_checkpoint_with_state_dict_inside_loads(tmp_path, tiny_tensors):
    sd, storages = state_dict(tiny_tensors)
    buf = io.BytesIO()
    TorchPickler(buf, legacy=False).dump({"epoch": 90, "state_dict": sd})
    w = load_weights(write_zip(tmp_path / "ckpt.pth", sd, storages, pickled=buf.getvalue()))
    assert w.parameter_count == sum(a.size for a in tiny_tensors.values())


class RunsShell:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class CallsEval:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("payload", ["shell", "eval"])
def test_malicious_pickle_is_refused_without_running(tmp_path, tiny_tensors, fmt, payload):
    marker = tmp_path / "pwned"
    evil = (RunsShell(f"touch {marker}") if payload == "shell"
            else CallsEval(f"open({str(marker)!r}, 'w').close()"))
    sd, storages = state_dict(tiny_tensors)
    pickled = pickle.dumps(collections.OrderedDict([("features.0.weight", evil)]), protocol=2)
    path = WRITERS[fmt](tmp_path / "evil.pth", sd, storages, pickled=pickled)
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    message = str(info.value)
    assert "refused" in message and str(path) in message
    assert (".system" in message) if payload == "shell" else ("builtin__.eval" in message)
    assert not marker.exists()


def test_the_malicious_payload_would_run_under_plain_pickle(tmp_path):
    """Guards the test above: its payload is live, so 'not created' means our unpickler stopped it."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(CallsEval(f"open({str(marker)!r}, 'w').close()"), protocol=2))
    assert marker.exists()


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_truncated_checkpoint_is_a_weights_error(tmp_path, tiny_tensors, fmt):
    sd, storages = state_dict(tiny_tensors)
    path = WRITERS[fmt](tmp_path / "t.pth", sd, storages)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(WeightsError, match="truncated") as info:
        load_weights(path)
    assert str(path) in str(info.value)


def test_legacy_checkpoint_cut_inside_the_pickle_is_a_weights_error(tmp_path, tiny_tensors):
    sd, storages = state_dict(tiny_tensors)
    path = write_legacy(tmp_path / "t.pth", sd, storages)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(WeightsError, match="truncated or damaged torch checkpoint"):
        load_weights(path)


def test_plain_pickle_that_is_not_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "thing.pth"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(WeightsError, match="not a torch checkpoint"):
        load_weights(path)


def test_wrong_shape_in_checkpoint_names_key_and_shapes(tmp_path, tiny_tensors):
    bad = dict(tiny_tensors)
    bad["features.5.weight"] = np.zeros((16, 3, 3, 3), np.float32)
    sd, storages = state_dict(bad)
    path = write_legacy(tmp_path / "s.pth", sd, storages)
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    assert str(info.value) == f"{path}: features.5.weight: expected shape (16, 8, 3, 3), got (16, 3, 3, 3)"


def test_legacy_checkpoint_written_with_pickle_protocol_4_is_recognised(tmp_path, tiny_tensors):
    path = write_legacy(tmp_path / "p4.pth", *state_dict(tiny_tensors), protocol=4)
    assert path.read_bytes()[:2] == b"\x80\x04"
    w = load_weights(path)
    assert w.format == "pth-legacy"
    np.testing.assert_array_equal(w.tensors["classifier.0.weight"], tiny_tensors["classifier.0.weight"])


def test_checkpoint_saved_from_a_gpu_loads_on_the_cpu(tmp_path, tiny_tensors, monkeypatch):
    monkeypatch.setattr(TorchPickler, "cuda", True)
    path = write_legacy(tmp_path / "gpu.pth", *state_dict(tiny_tensors))
    assert b"torch.cuda" in path.read_bytes()[:4096]
    np.testing.assert_array_equal(load_weights(path).tensors["features.0.bias"], tiny_tensors["features.0.bias"])
