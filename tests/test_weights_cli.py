"""`vggserve weights init|info|convert|where`, and converted files giving the same logits as their source."""

import subprocess
import sys

import numpy as np
import pytest

from vggserve.cli import main
from vggserve.weights import load_weights


def _run(capsys, *argv):
    code = main(["weights", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _field(out, name):
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith(name + ":"))


def test_init_is_deterministic_per_seed(tmp_path, capsys):
    digests = []
    for seed, name in ((0, "a"), (0, "b"), (1, "c")):
        code, out, _ = _run(capsys, "init", "--seed", str(seed), "--width", "0.125",
                            "--output", str(tmp_path / f"{name}.safetensors"))
        assert code == 0
        assert _field(out, "path") == str(tmp_path / f"{name}.safetensors")
        assert _field(out, "parameters") == "2,612,368"
        digests.append(_field(out, "sha256"))
    assert digests[0] == digests[1] != digests[2]
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_init_writes_torchvision_names_that_load(tmp_path, capsys, tiny_tensors):
    path = tmp_path / "w.safetensors"
    assert _run(capsys, "init", "--seed", "0", "--width", "0.125", "--output", str(path))[0] == 0
    w = load_weights(path)
    assert w.key_scheme == "torchvision" and w.metadata["seed"] == "0"
    for key, arr in tiny_tensors.items():  # the same tensors as init_weights(0, 0.125)
        np.testing.assert_array_equal(w.tensors[key], arr)


def test_init_rejects_a_bad_width(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["weights", "init", "--seed", "0", "--width", "2", "--output", str(tmp_path / "w.safetensors")])
    assert "width must be in (0, 1]" in capsys.readouterr().err


def test_every_accepted_width_gives_shapes_the_loader_reads_back():
    """init rounded each layer (round(c * w)) while the loader read the width from features.0 / 64: at 0.1 a file
    had 13 channels in features.5 where the loader expected 12. One rule (`scaled`) now serves both."""
    from vggserve.weights.spec import infer_width, vgg16_spec

    for width in [i / 1000 for i in range(1, 1001)]:
        made = vgg16_spec(width).shapes()
        read = vgg16_spec(infer_width({"features.0.weight": np.empty(made["features.0.weight"])})).shapes()
        assert read == made, width


@pytest.mark.parametrize("width, snapped", [("0.1", 0.09375), ("0.3", 0.296875), ("0.01", 0.015625)])
def test_init_at_an_odd_width_writes_a_file_that_loads(tmp_path, capsys, width, snapped):
    path = tmp_path / "w.safetensors"
    code, out, _ = _run(capsys, "init", "--seed", "0", "--width", width, "--output", str(path))
    assert code == 0 and _field(out, "width") == f"{snapped:g} ({width} snapped to a multiple of 1/64)"
    w = load_weights(path)
    assert w.width == snapped and float(w.metadata["width"]) == snapped


@pytest.mark.parametrize("seed", ["-1", "1.5", "x"])
def test_init_rejects_a_bad_seed_with_a_usage_error(tmp_path, capsys, seed):
    """--seed -1 used to end in numpy's ValueError traceback."""
    with pytest.raises(SystemExit) as exc:
        main(["weights", "init", "--seed", seed, "--output", str(tmp_path / "w.safetensors")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "seed must be a whole number >= 0" in err and "Traceback" not in err
    assert not (tmp_path / "w.safetensors").exists()


def test_info_prints_format_scheme_count_width_sha_and_preprocessing(tiny_weights_path, capsys):
    import hashlib

    code, out, _ = _run(capsys, "info", str(tiny_weights_path))
    assert code == 0
    assert _field(out, "format") == "safetensors"
    assert _field(out, "key scheme") == "torchvision"
    assert _field(out, "parameters") == "2,612,368"
    assert _field(out, "width").startswith("0.125")
    assert _field(out, "sha256") == hashlib.sha256(tiny_weights_path.read_bytes()).hexdigest()
    assert _field(out, "preprocessing").startswith("torchvision")


def test_info_on_a_bad_file_is_one_line_and_exit_4(tmp_path, capsys):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"garbage")
    code, out, err = _run(capsys, "info", str(bad))
    assert code == 4 and out == ""
    assert err.count("\n") == 1 and err.startswith("vggserve: error: ") and str(bad) in err


def test_convert_npz_to_safetensors_records_source(tmp_path, capsys, tiny_tensors):
    src = tmp_path / "w.npz"
    np.savez(src, **tiny_tensors)
    dst = tmp_path / "out.safetensors"
    code, out, _ = _run(capsys, "convert", str(src), str(dst))
    assert code == 0 and str(dst) in out
    w = load_weights(dst)
    assert (w.format, w.key_scheme) == ("safetensors", "torchvision")
    assert w.metadata["source_format"] == "npz" and w.metadata["source_file"] == "w.npz"
    assert w.metadata["preprocessing"] == "torchvision"


def test_converted_keras_file_keeps_caffe_preprocessing(tmp_path, capsys, tiny_tensors, rng):
    from test_weights_formats import keras_weights, write_keras_h5

    src = write_keras_h5(tmp_path / "k.h5", keras_weights(tiny_tensors, rng))
    dst = tmp_path / "k.safetensors"
    assert _run(capsys, "convert", str(src), str(dst))[0] == 0
    w = load_weights(dst)
    assert (w.key_scheme, w.preprocessing, w.metadata["source_format"]) == ("torchvision", "caffe", "keras-h5")
    code, out, _ = _run(capsys, "info", str(dst))
    assert _field(out, "preprocessing").startswith("caffe")


def test_convert_refuses_to_overwrite_its_input(tiny_weights_path, capsys):
    code, _, err = _run(capsys, "convert", str(tiny_weights_path), str(tiny_weights_path))
    assert code == 4 and "overwrite the input" in err


def test_where_prints_the_default_weights(tmp_path, capsys, monkeypatch, tiny_weights_path):
    monkeypatch.setenv("VGGSERVE_WEIGHTS", str(tiny_weights_path))
    code, out, _ = _run(capsys, "where")
    assert code == 0 and out.strip() == str(tiny_weights_path)


def test_weights_command_runs_as_a_program(tmp_path):
    """The console entry point path: `python -m vggserve weights info` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-m", "vggserve", "weights", "info", str(tmp_path / "none.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4
    assert proc.stderr.strip() == f"vggserve: error: {tmp_path / 'none.safetensors'}: no such weights file"


@pytest.fixture(scope="module")
def engine_available():
    try:
        from vggserve.model.vgg16 import VGG16
    except ImportError as exc:  # the engine module itself is missing: nothing to compare on
        pytest.fail(f"engine not importable: {exc}")
    return VGG16


def test_converted_pth_gives_the_same_logits_as_the_original_on_the_engine(
        tmp_path, capsys, tiny_tensors, engine_available):
    """legacy .pth -> convert -> safetensors; both loaded by the OpenCL engine on the CPU, same input."""
    from test_weights_pth import state_dict, write_legacy

    src = write_legacy(tmp_path / "vgg16.pth", *state_dict(tiny_tensors))
    dst = tmp_path / "vgg16.safetensors"
    assert _run(capsys, "convert", str(src), str(dst))[0] == 0
    x = np.random.default_rng(7).standard_normal((2, 3, 224, 224)).astype(np.float32)
    results = []
    for path in (src, dst):
        model = engine_available.load(path, device="cpu", max_batch_size=2)
        try:
            results.append(model.logits(x))
        finally:
            model.close()
    np.testing.assert_array_equal(results[0], results[1])
    from vggserve.model.reference import reference_logits

    ref = reference_logits(tiny_tensors, x)
    np.testing.assert_allclose(results[1], ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_converted_timm_and_keras_files_give_the_same_logits_as_their_source(tmp_path, capsys, tiny_tensors, rng):
    """Reference (float64 numpy) forward: exact equality of logits before and after conversion."""
    from safetensors.numpy import save_file
    from test_weights_formats import keras_weights, timm_layout, write_keras_h5

    from vggserve.model.reference import reference_logits

    timm_src = tmp_path / "timm.safetensors"
    save_file(timm_layout(tiny_tensors), str(timm_src))
    keras_src = write_keras_h5(tmp_path / "k.h5", keras_weights(tiny_tensors, rng))
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    for src in (timm_src, keras_src):
        dst = tmp_path / f"{src.stem}-converted.safetensors"
        assert _run(capsys, "convert", str(src), str(dst))[0] == 0
        np.testing.assert_array_equal(reference_logits(load_weights(src).tensors, x),
                                      reference_logits(load_weights(dst).tensors, x))


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_no_temporary_file(tmp_path, capsys,
                                                                                     tiny_weights_path):
    """init, convert and prune used to end in a FileExistsError or IsADirectoryError traceback."""
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    commands = [
        ["init", "--seed", "0", "--width", "0.125", "--output", str(tmp_path / "file" / "w.safetensors")],
        ["convert", str(tiny_weights_path), str(tmp_path / "folder")],
        ["prune", "--sparsity", "0.5", str(tiny_weights_path), str(tmp_path / "file" / "p.safetensors")],
    ]
    for command in commands:
        assert main(["weights", *command]) == 4, command
        err = capsys.readouterr().err.strip()
        assert err.startswith("vggserve: error: ") and "cannot write" in err and "\n" not in err, err
    assert list((tmp_path / "folder").iterdir()) == []
