"""load_weights on safetensors, .npz, timm and Keras files, and every way a file can be wrong."""

import json
import struct
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vggserve.errors import WeightsError, WeightsNotFound
from vggserve.model.reference import reference_logits
from vggserve.weights import load_weights, save_safetensors, weights_from_tensors
from vggserve.weights.schemes import KERAS_CONV_LAYERS, KERAS_FC_LAYERS


def _assert_same(loaded, expected):
    assert loaded.keys() == expected.keys()
    for key, arr in expected.items():
        np.testing.assert_array_equal(loaded[key], arr, err_msg=key)
        assert loaded[key].dtype == np.float32 and loaded[key].flags.c_contiguous and loaded[key].flags.aligned


# ---- safetensors and npz -------------------------------------------------------------------------------------

def test_safetensors_loads_as_memory_mapped_float32(tiny_weights_path, tiny_tensors):
    w = load_weights(tiny_weights_path)
    assert (w.format, w.key_scheme, w.preprocessing, w.width) == ("safetensors", "torchvision", "torchvision", 0.125)
    _assert_same(w.tensors, tiny_tensors)
    assert not w.tensors["features.0.weight"].flags.writeable  # a view of the read-only map, not a copy
    assert w.parameter_count == sum(a.size for a in tiny_tensors.values())


def test_sha256_is_computed_lazily_and_matches_hashlib(tiny_weights_path):
    import hashlib

    w = load_weights(tiny_weights_path)
    assert "sha256" not in w.__dict__
    assert w.sha256 == hashlib.sha256(tiny_weights_path.read_bytes()).hexdigest()
    assert "sha256" in w.__dict__


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_safetensors_in_other_float_types_become_float32(tmp_path, tiny_tensors, dtype):
    path = tmp_path / "w.safetensors"
    save_file({k: v.astype(dtype) for k, v in tiny_tensors.items()}, str(path))
    w = load_weights(path)
    _assert_same(w.tensors, {k: v.astype(dtype).astype(np.float32) for k, v in tiny_tensors.items()})


def test_bfloat16_safetensors_widen_exactly(tmp_path, tiny_tensors):
    """BF16 is the top half of a float32: write truncated values by hand and expect them back exactly."""
    t = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in tiny_tensors.items()}
    header, blobs, offset = {}, [], 0
    for key, arr in t.items():
        raw = (arr.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[key] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    _assert_same(load_weights(path).tensors, t)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_loads_with_numpy_alone(tmp_path, tiny_tensors, compressed):
    path = tmp_path / "weights.bin"  # the extension is irrelevant: the format comes from the magic bytes
    (np.savez_compressed if compressed else np.savez)(path, **tiny_tensors)
    path = path.with_suffix(".bin.npz")
    w = load_weights(path)
    assert w.format == "npz"
    _assert_same(w.tensors, tiny_tensors)


def test_format_is_detected_from_content_not_extension(tmp_path, tiny_tensors):
    path = tmp_path / "really-safetensors.npz"
    save_file(tiny_tensors, str(path))
    assert load_weights(path).format == "safetensors"


def crafted_safetensors(path, header_len: int):
    """A valid one-tensor safetensors file whose header is padded with spaces to exactly `header_len` bytes."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    assert len(header) <= header_len
    path.write_bytes(struct.pack("<Q", header_len) + header.ljust(header_len) + np.float32([1.5, -2]).tobytes())
    return path


def test_safetensors_is_recognised_whatever_the_low_byte_of_its_header_length(tmp_path):
    """The first byte of a safetensors file is its header length's low byte: 0x80 (a pickle's first byte) included."""
    from vggserve.weights.sniff import detect_format

    refused = []
    for low_byte in range(256):
        path = crafted_safetensors(tmp_path / f"w{low_byte}.bin", 256 + low_byte)
        assert path.read_bytes()[0] == low_byte
        np.testing.assert_array_equal(load_file(str(path))["w"], [1.5, -2])  # the library agrees it is valid
        try:
            if detect_format(path) != "safetensors":
                refused.append(low_byte)
        except WeightsError:
            refused.append(low_byte)
    assert refused == []


def test_quarter_width_weights_that_start_with_0x80_load(tmp_path, capsys):
    """`vggserve weights init --width 0.25` writes a header of 0x0b80 bytes: it used to be refused as a pickle."""
    from vggserve.cli import main

    path = tmp_path / "quarter.safetensors"
    assert main(["weights", "init", "--seed", "0", "--width", "0.25", "--output", str(path)]) == 0
    assert path.read_bytes()[:1] == b"\x80"
    loaded = load_weights(path)
    assert loaded.format == "safetensors" and loaded.width == 0.25


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after)."""
    import os

    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)], ids=["022", "027", "002"])
def test_written_weights_get_the_permissions_the_umask_gives(tmp_path, tiny_tensors, umask, mask, mode, capsys):
    """A weights file made by one user (an administrator) must be readable by another (the service's) where
    the umask says so, as with any file written in place; mkstemp made every file 0600."""
    from vggserve.cli import main

    umask(mask)
    saved = save_safetensors(tiny_tensors, tmp_path / "saved.safetensors")
    init = ["weights", "init", "--seed", "0", "--width", "0.125", "--output", str(tmp_path / "init.safetensors")]
    assert main(init) == 0
    assert main(["weights", "convert", str(saved), str(tmp_path / "converted.safetensors")]) == 0
    for name in ("saved", "init", "converted"):
        assert (tmp_path / f"{name}.safetensors").stat().st_mode & 0o777 == mode, name


def test_a_pickle_that_is_not_a_torch_checkpoint_is_still_named_a_pickle(tmp_path):
    import pickle

    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        path = tmp_path / f"p{protocol}.pth"
        path.write_bytes(pickle.dumps({"features.0.weight": [1.0] * 64}, protocol=protocol))
        with pytest.raises(WeightsError, match="a Python pickle but not a torch checkpoint"):
            load_weights(path)


def test_a_header_length_past_the_end_is_a_truncated_safetensors_file(tmp_path):
    path = tmp_path / "cut.bin"
    path.write_bytes(crafted_safetensors(tmp_path / "whole.bin", 300).read_bytes()[:100])
    with pytest.raises(WeightsError, match=r"cut\.bin: truncated safetensors file \(header of 300 bytes"):
        load_weights(path)


def test_save_safetensors_is_atomic_and_keeps_metadata(tmp_path, tiny_tensors):
    path = tmp_path / "sub" / "out.safetensors"
    save_safetensors(tiny_tensors, path, {"preprocessing": "caffe", "seed": 3})
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.safetensors"]  # no temp file left
    _assert_same(load_file(str(path)), tiny_tensors)
    w = load_weights(path)
    assert w.preprocessing == "caffe" and w.metadata["seed"] == "3"


def test_failed_save_leaves_no_partial_file(tmp_path, tiny_tensors):
    path = tmp_path / "out.safetensors"
    with pytest.raises(Exception):
        save_safetensors({**tiny_tensors, "bad": np.array(["not", "numbers"])}, path)
    assert list(tmp_path.iterdir()) == []


# ---- timm key scheme -------------------------------------------------------------------------------------------

def timm_layout(tv):
    """torchvision-named tensors as timm's vgg16.tv_in1k names and shapes (fc layers as 7x7 and 1x1 convs)."""
    out = {k: v for k, v in tv.items() if k.startswith("features.")}
    c = tv["features.28.weight"].shape[0]
    out["pre_logits.fc1.weight"] = tv["classifier.0.weight"].reshape(-1, c, 7, 7)
    out["pre_logits.fc1.bias"] = tv["classifier.0.bias"]
    out["pre_logits.fc2.weight"] = tv["classifier.3.weight"].reshape(*tv["classifier.3.weight"].shape, 1, 1)
    out["pre_logits.fc2.bias"] = tv["classifier.3.bias"]
    out["head.fc.weight"], out["head.fc.bias"] = tv["classifier.6.weight"], tv["classifier.6.bias"]
    return out


def test_timm_names_and_conv_shaped_classifier_convert(tmp_path, tiny_tensors):
    path = tmp_path / "model.safetensors"
    save_file(timm_layout(tiny_tensors), str(path))
    w = load_weights(path)
    assert (w.key_scheme, w.preprocessing) == ("timm", "torchvision")
    _assert_same(w.tensors, tiny_tensors)


def test_timm_fc1_as_7x7_convolution_equals_the_converted_linear_layer(rng):
    """What the reshape relies on: a 7x7 conv over a 7x7 map is the linear layer on the (c, h, w) flatten."""
    from vggserve.weights.schemes import to_torchvision

    conv_w = rng.standard_normal((6, 4, 7, 7))
    features = rng.standard_normal((4, 7, 7))
    conv_out = np.einsum("ochw,chw->o", conv_w, features)
    linear_w = to_torchvision({"pre_logits.fc1.weight": conv_w}, "timm")["classifier.0.weight"]
    np.testing.assert_allclose(linear_w @ features.reshape(-1), conv_out, rtol=1e-12)


def test_timm_missing_key_is_named_as_in_the_file(tmp_path, tiny_tensors):
    t = timm_layout(tiny_tensors)
    del t["pre_logits.fc2.bias"]
    path = tmp_path / "model.safetensors"
    save_file(t, str(path))
    with pytest.raises(WeightsError, match=r"missing key pre_logits\.fc2\.bias \(-> classifier\.3\.bias\)"):
        load_weights(path)


# ---- Keras h5 ----------------------------------------------------------------------------------------------------

def keras_weights(tiny_tensors, rng):
    """Random Keras-layout VGG16 weights at the tiny width: HWIO conv kernels and (in, out) dense kernels."""
    out, cin = {}, 3
    for layer, key in zip(KERAS_CONV_LAYERS, [k for k in tiny_tensors if k.startswith("features.")][::2]):
        cout = tiny_tensors[key].shape[0]
        out[layer] = (rng.standard_normal((3, 3, cin, cout)).astype(np.float32) * np.sqrt(2 / (9 * cin)),
                      rng.standard_normal(cout).astype(np.float32) * 0.05)
        cin = cout
    fin = 7 * 7 * cin
    for layer, fout in zip(KERAS_FC_LAYERS, (tiny_tensors["classifier.0.bias"].size,) * 2 + (1000,)):
        out[layer] = (rng.standard_normal((fin, fout)).astype(np.float32) * np.sqrt(2 / fin),
                      rng.standard_normal(fout).astype(np.float32) * 0.05)
        fin = fout
    return out


def write_keras_h5(path, weights):
    """The layout of Keras 2 save_weights: a group per layer, <layer>/<layer>/kernel:0 and bias:0."""
    h5py = pytest.importorskip("h5py")
    names = ["input_1", *KERAS_CONV_LAYERS[:2], "block1_pool", *KERAS_CONV_LAYERS[2:], "flatten", *KERAS_FC_LAYERS]
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [n.encode() for n in names]
        f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.1.6"
        for name in names:
            g = f.create_group(name)
            if name in weights:
                g.attrs["weight_names"] = [f"{name}/kernel:0".encode(), f"{name}/bias:0".encode()]
                g.create_dataset(f"{name}/kernel:0", data=weights[name][0])
                g.create_dataset(f"{name}/bias:0", data=weights[name][1])
            else:
                g.attrs["weight_names"] = []
    return path


def keras_style_logits(weights, x_nhwc):
    """Keras' own computation, channels-last: HWIO convs, (h, w, c) flatten, x @ kernel dense layers."""
    a = x_nhwc.astype(np.float64)
    pools_after = {"block1_conv2", "block2_conv2", "block3_conv3", "block4_conv3", "block5_conv3"}
    for layer in KERAS_CONV_LAYERS:
        k, b = (t.astype(np.float64) for t in weights[layer])
        n, h, w, _ = a.shape
        p = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
        a = sum(p[:, dy:dy + h, dx:dx + w, :] @ k[dy, dx] for dy in range(3) for dx in range(3)) + b
        a = np.maximum(a, 0)
        if layer in pools_after:
            a = a.reshape(n, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4))
    a = a.reshape(a.shape[0], -1)
    for layer in KERAS_FC_LAYERS:
        k, b = (t.astype(np.float64) for t in weights[layer])
        a = a @ k + b
        if layer != "predictions":
            a = np.maximum(a, 0)
    return a


def test_keras_h5_gives_keras_logits_through_the_torchvision_reference(tmp_path, tiny_tensors, rng):
    """Independent check of the HWIO transpose and the fc1 row reorder: Keras' channels-last computation on
    the Keras tensors equals our channels-first reference on the converted tensors."""
    weights = keras_weights(tiny_tensors, rng)
    path = write_keras_h5(tmp_path / "vgg16_weights_tf_dim_ordering_tf_kernels.h5", weights)
    w = load_weights(path)
    assert (w.format, w.key_scheme, w.preprocessing, w.width) == ("keras-h5", "keras", "caffe", 0.125)
    x = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    expected = keras_style_logits(weights, x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(reference_logits(w.tensors, x), expected, rtol=1e-6, atol=1e-6)


def test_keras_whole_model_file_with_model_weights_group_loads(tmp_path, tiny_tensors, rng):
    h5py = pytest.importorskip("h5py")
    weights = keras_weights(tiny_tensors, rng)
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        mw = f.create_group("model_weights")
        for name, (k, b) in weights.items():
            mw.create_dataset(f"{name}/{name}/kernel:0", data=k)
            mw.create_dataset(f"{name}/{name}/bias:0", data=b)
    assert load_weights(path).key_scheme == "keras"


def test_keras_file_without_top_layers_names_the_missing_layer(tmp_path, tiny_tensors, rng):
    weights = keras_weights(tiny_tensors, rng)
    for layer in KERAS_FC_LAYERS:
        del weights[layer]
    path = write_keras_h5(tmp_path / "notop.h5", weights)
    with pytest.raises(WeightsError, match=r"missing key fc1\.kernel \(-> classifier\.0\.weight\)"):
        load_weights(path)


def test_keras_without_h5py_says_how_to_install_it(tmp_path, tiny_tensors, rng, monkeypatch):
    path = write_keras_h5(tmp_path / "k.h5", keras_weights(tiny_tensors, rng))
    monkeypatch.setitem(sys.modules, "h5py", None)  # makes `import h5py` raise ImportError
    with pytest.raises(WeightsError, match=r"pip install 'vggserve\[keras\]'"):
        load_weights(path)


def test_truncated_h5_is_a_weights_error(tmp_path, tiny_tensors, rng):
    path = write_keras_h5(tmp_path / "k.h5", keras_weights(tiny_tensors, rng))
    path.write_bytes(path.read_bytes()[:4000])
    with pytest.raises(WeightsError, match="truncated or unreadable HDF5"):
        load_weights(path)


# ---- errors ------------------------------------------------------------------------------------------------------

def _save(tmp_path, tensors, name="w.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_wrong_shape_names_file_key_and_both_shapes(tmp_path, tiny_tensors):
    path = _save(tmp_path, {**tiny_tensors, "features.5.weight": np.zeros((16, 3, 3, 3), np.float32)})
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    assert str(info.value) == f"{path}: features.5.weight: expected shape (16, 8, 3, 3), got (16, 3, 3, 3)"


def test_missing_key_names_file_key_and_expected_shape(tmp_path, tiny_tensors):
    path = _save(tmp_path, {k: v for k, v in tiny_tensors.items() if k != "classifier.3.bias"})
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    assert str(info.value) == f"{path}: missing key classifier.3.bias (expected shape (512,))"


def test_unknown_key_names_are_reported_as_missing_vgg16_keys(tmp_path, tiny_tensors):
    path = _save(tmp_path, {"conv1.weight": tiny_tensors["features.0.weight"]})
    with pytest.raises(WeightsError, match=r"missing key features\.0\.weight \(expected shape \(64, 3, 3, 3\)\)"):
        load_weights(path)


def test_unexpected_extra_keys_are_refused(tmp_path, tiny_tensors):
    path = _save(tmp_path, {**tiny_tensors, "features.1.running_mean": np.zeros(8, np.float32)})
    with pytest.raises(WeightsError, match=r"unexpected keys for VGG16: features\.1\.running_mean"):
        load_weights(path)


def test_integer_tensor_is_refused(tmp_path, tiny_tensors):
    path = _save(tmp_path, {**tiny_tensors, "features.0.bias": np.zeros(8, np.int32)})
    with pytest.raises(WeightsError, match=r"features\.0\.bias: dtype I32 is not a float type"):
        load_weights(path)


@pytest.mark.parametrize("keep", [4, 100, 0.5])
def test_truncated_safetensors_is_a_weights_error_naming_the_file(tmp_path, tiny_weights_path, keep):
    data = tiny_weights_path.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    with pytest.raises(WeightsError, match="truncated") as info:
        load_weights(path)
    assert str(path) in str(info.value)


def test_truncated_safetensors_names_the_first_cut_tensor(tmp_path, tiny_weights_path):
    data = tiny_weights_path.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:-10])
    with pytest.raises(WeightsError, match=r": \S+\.(weight|bias): truncated file"):
        load_weights(path)


def test_truncated_npz_is_a_weights_error(tmp_path, tiny_tensors):
    path = tmp_path / "w.npz"
    np.savez(path, **tiny_tensors)
    path.write_bytes(path.read_bytes()[:-5000])
    with pytest.raises(WeightsError, match="truncated or damaged"):
        load_weights(path)


@pytest.mark.parametrize("content", [b"", b"hello, not weights at all", b"\x00" * 100])
def test_unrecognised_file_is_a_weights_error(tmp_path, content):
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightsError, match=r"empty|not a supported weights file"):
        load_weights(path)


def test_safetensors_header_that_is_not_json_is_unreadable(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 10) + b"{not json}")
    with pytest.raises(WeightsError, match="unreadable safetensors header"):
        load_weights(path)


@pytest.mark.parametrize("header, message", [
    ({"__metadata__": ["a", "b"]}, r"__metadata__ is not a JSON object"),
    ({"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, r"w: malformed safetensors header entry"),
    ({"w": {"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]}}, r"w: malformed safetensors header entry"),
])
def test_safetensors_header_of_the_wrong_json_types_is_a_weights_error(tmp_path, header, message):
    """A list as __metadata__ or as a dtype used to be an AttributeError or TypeError traceback."""
    text = json.dumps(header).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(WeightsError, match=message):
        load_weights(path)


@pytest.mark.parametrize("key, value", [("features.0.weight", np.nan), ("classifier.6.bias", np.inf),
                                        ("classifier.0.weight", -np.inf)])
def test_weights_that_are_not_finite_are_a_weights_error_naming_the_tensor(tmp_path, tiny_tensors, key, value):
    """They used to load: NaN probabilities (printed as `NaN`, not JSON) or, behind a ReLU, silently wrong ones."""
    bad = np.array(tiny_tensors[key])
    bad.reshape(-1)[[0, 5]] = value
    path = _save(tmp_path, {**tiny_tensors, key: bad})
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    assert str(info.value).startswith(f"{path}: {key}: 2 of {bad.size:,} values are NaN or infinite")
    with pytest.raises(WeightsError, match="NaN or infinite"):
        weights_from_tensors({**tiny_tensors, key: bad})


def test_large_finite_weights_whose_sum_overflows_still_load(tiny_tensors):
    big = np.full_like(tiny_tensors["classifier.0.weight"], 3e38)
    with np.errstate(over="ignore"):
        assert np.isinf(big.sum())
    loaded = weights_from_tensors({**tiny_tensors, "classifier.0.weight": big})
    assert loaded.tensors["classifier.0.weight"][0, 0] == np.float32(3e38)


def test_float64_weights_too_large_for_float32_are_refused(tmp_path, tiny_tensors):
    huge = tiny_tensors["features.0.bias"].astype(np.float64)
    huge[3] = 1e300
    with pytest.raises(WeightsError, match=r"features\.0\.bias: 1 of 8 values are NaN or infinite"):
        weights_from_tensors({**tiny_tensors, "features.0.bias": huge})


def test_missing_file_is_weights_not_found(tmp_path):
    with pytest.raises(WeightsNotFound, match="no such weights file"):
        load_weights(tmp_path / "nope.safetensors")


def test_in_memory_tensors_get_the_same_validation(tiny_tensors):
    assert weights_from_tensors(tiny_tensors).format == "memory"
    with pytest.raises(WeightsError, match="missing key"):
        weights_from_tensors({k: v for k, v in tiny_tensors.items() if k != "features.0.bias"})


@pytest.mark.slow
def test_full_vgg16_safetensors_loads_quickly_without_copies(tmp_path, full_tensors):
    import time

    path = _save(tmp_path, full_tensors, "vgg16.safetensors")
    t0 = time.perf_counter()
    w = load_weights(path)
    elapsed = time.perf_counter() - t0
    assert w.width == 1.0 and w.parameter_count == 138_357_544
    assert all(not a.flags.owndata for a in w.tensors.values())  # views of the memory map
    assert elapsed < 10.0, f"loading took {elapsed:.2f} s"  # ~0.01 s here: nothing is read until used
