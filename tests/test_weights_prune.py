"""`vggserve weights prune` and the sparsity `weights info` prints: which weights go, how many, and the provenance."""

import hashlib
import json

import numpy as np
import pytest

from vggserve.cli import main
from vggserve.weights import load_weights
from vggserve.weights.prune import (is_2_4, layer_sparsities, prune, prune_2_4, prune_global, prune_unstructured,
                                    weight_layers)


def _run(capsys, *argv):
    code = main(["weights", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _smallest_went(before: np.ndarray, after: np.ndarray) -> bool:
    """Every weight zeroed by pruning is no larger in magnitude than every weight kept."""
    zeroed = np.abs(before[(after == 0) & (before != 0)])
    kept = np.abs(before[after != 0])
    return zeroed.size == 0 or kept.size == 0 or zeroed.max() <= kept.min()


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_unstructured_zeroes_exactly_the_fraction_and_the_smallest(rng, fraction):
    w = rng.standard_normal((37, 11, 3, 3)).astype(np.float32)
    out = prune_unstructured(w, fraction)
    assert out.shape == w.shape and out.dtype == np.float32
    assert np.count_nonzero(out == 0) == round(fraction * w.size)
    assert _smallest_went(w, out)
    assert np.array_equal(out[out != 0], w[out != 0])  # kept weights are unchanged
    assert np.count_nonzero(w == 0) == 0  # the input is not modified


def test_unstructured_ties_are_broken_by_position_so_the_result_is_reproducible():
    w = np.array([[1.0, -1.0, 1.0, 2.0, -1.0, 3.0]], np.float32)
    out = prune_unstructured(w, 0.5)
    assert out.tolist() == [[0.0, 0.0, 0.0, 2.0, -1.0, 3.0]]


def test_already_zero_weights_count_towards_the_fraction(rng):
    w = prune_unstructured(rng.standard_normal((64, 64)).astype(np.float32), 0.5)
    out = prune_unstructured(w, 0.9)
    assert np.count_nonzero(out == 0) == round(0.9 * w.size) and _smallest_went(w, out)


def test_global_uses_one_threshold_over_all_layers(rng):
    small = rng.standard_normal((8, 100)).astype(np.float32) * 0.01
    large = rng.standard_normal((8, 100)).astype(np.float32)
    a, b = prune_global([small, large], 0.5)
    assert np.count_nonzero(a == 0) + np.count_nonzero(b == 0) == 800
    assert np.count_nonzero(a) < 40 < np.count_nonzero(b)  # the small-magnitude layer loses almost everything
    kept = np.concatenate([np.abs(a[a != 0]), np.abs(b[b != 0])])
    zeroed = np.concatenate([np.abs(small[a == 0]), np.abs(large[b == 0])])
    assert zeroed.max() <= kept.min()


@pytest.mark.parametrize("shape", [(5, 3, 3, 3), (7, 16, 3, 3), (4, 10, 3, 3), (9, 10), (3, 6)])
def test_2_4_keeps_the_two_largest_of_every_group_of_four_along_k(rng, shape):
    """Groups: 4 consecutive input channels of one tap for a convolution (the tensor-core kernels' K order,
    (ky*3 + kx)*Cpad + ci), 4 consecutive inputs for a fully connected layer; a short last group zero-padded."""
    w = rng.standard_normal(shape).astype(np.float32)
    out = prune_2_4(w)
    assert out.shape == w.shape and is_2_4(out) and not is_2_4(w)
    rows = (lambda a: a.transpose(0, 2, 3, 1).reshape(-1, shape[1])) if len(shape) == 4 else (lambda a: a)
    w2, o2 = rows(w), rows(out)
    for m in range(w2.shape[0]):
        for g in range(0, shape[1], 4):
            group, got = w2[m, g:g + 4], o2[m, g:g + 4]
            keep = np.sort(np.argsort(-np.abs(group), kind="stable")[:2])
            assert np.flatnonzero(got).tolist() == keep.tolist()
            assert np.array_equal(got[keep], group[keep])


def test_2_4_of_a_convolution_is_2_4_in_the_tensor_core_k_order(rng):
    from vggserve.ops import precision, sparse24
    from vggserve.ops.tensorcore import tc_weights

    w = prune_2_4(rng.standard_normal((6, 13, 3, 3)).astype(np.float32))
    laid = tc_weights(w, cpad=16, npad=16, kpad=160, precision=precision.FP16)  # k = (ky*3 + kx)*16 + ci
    assert sparse24.is_2_4(laid)
    flat = w.reshape(6, -1)  # the (Cin, 3, 3) flatten order mixes taps: not 2:4 there
    assert not is_2_4(flat)


def test_2_4_partial_last_group_counts_as_zero_padded():
    w = np.array([[1, 2, 3, 4, 5, 6, 7]], np.float32)  # K = 7: groups [1 2 3 4] and [5 6 7 (0)]
    assert prune_2_4(w).tolist() == [[0, 0, 3, 4, 0, 6, 7]]
    assert is_2_4(np.array([[0, 0, 3, 4, 0, 6, 7]], np.float32))
    assert not is_2_4(np.array([[0, 0, 3, 4, 5, 6, 7]], np.float32))


def test_prune_selects_layers_and_never_touches_biases(tiny_tensors):
    out = prune(tiny_tensors, 0.9, layers="conv")
    convs, fcs = weight_layers(tiny_tensors, "conv"), weight_layers(tiny_tensors, "fc")
    assert len(convs) == 13 and len(fcs) == 3
    for name in convs:
        assert abs(out.layer_sparsity[name] - 0.9) < 0.01
    for name in fcs:
        assert out.tensors[f"{name}.weight"] is tiny_tensors[f"{name}.weight"] and out.layer_sparsity[name] < 0.01
    for key, value in tiny_tensors.items():
        if key.endswith(".bias"):
            assert out.tensors[key] is value


@pytest.mark.parametrize("kwargs, message", [
    (dict(target=None), "--sparsity is required"),
    (dict(target=1.5), "between 0 and 1"),
    (dict(target=0.9, pattern="2:4"), "2:4 always prunes half"),
    (dict(target=None, pattern="2:4", scope="global"), "unstructured only"),
    (dict(target=0.5, pattern="1:4"), "pattern must be one of"),
])
def test_bad_options_say_how_to_fix_them(tiny_tensors, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune(tiny_tensors, **kwargs)


def test_cli_prune_writes_safetensors_with_provenance(tmp_path, capsys, tiny_weights_path, tiny_tensors):
    out_path = tmp_path / "pruned.safetensors"
    code, out, _ = _run(capsys, "prune", "--sparsity", "0.9", "--layers", "all", str(tiny_weights_path),
                        str(out_path))
    assert code == 0 and str(out_path) in out
    w = load_weights(out_path)
    m = w.metadata
    assert m["source_sha256"] == hashlib.sha256(tiny_weights_path.read_bytes()).hexdigest()
    assert (m["prune_pattern"], m["prune_sparsity"], m["prune_scope"], m["prune_layers"]) == (
        "unstructured", "0.9", "layer", "all")
    recorded = json.loads(m["layer_sparsity"])
    measured = layer_sparsities(w.tensors)
    assert list(recorded) == list(measured) and len(recorded) == 16
    for name, value in measured.items():
        assert abs(recorded[name] - value) < 1e-6 and abs(value - 0.9) < 0.01
    expected = prune(tiny_tensors, 0.9).tensors
    for key, arr in expected.items():
        np.testing.assert_array_equal(w.tensors[key], arr, err_msg=key)


def test_cli_prune_2_4_then_info_reports_every_layer(tmp_path, capsys, tiny_weights_path):
    out_path = tmp_path / "p24.safetensors"
    assert _run(capsys, "prune", "--pattern", "2:4", "--layers", "fc", str(tiny_weights_path), str(out_path))[0] == 0
    code, out, _ = _run(capsys, "info", str(out_path))
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("features.", "classifier."))}
    assert len(rows) == 16
    assert rows["classifier.3"][-2:] == ["0.5000", "yes"] and rows["features.2"][-2:] == ["0.0000", "no"]
    assert "pruned:        2:4, 0.5 per layer, layers fc" in out


def test_cli_prune_global_says_overall_not_per_global(tmp_path, capsys, tiny_weights_path):
    """`--scope global` printed "0.9 per global"."""
    out_path = tmp_path / "g.safetensors"
    code, out, _ = _run(capsys, "prune", "--sparsity", "0.9", "--scope", "global", str(tiny_weights_path),
                        str(out_path))
    assert code == 0 and "0.9 overall (one threshold over the layers)" in out and "per global" not in out
    code, out, _ = _run(capsys, "info", str(out_path))
    assert code == 0 and "0.9 overall (one threshold over the layers), layers all" in out and "per global" not in out


def test_cli_info_prints_sparsity_of_an_unpruned_file(capsys, tiny_weights_path):
    code, out, _ = _run(capsys, "info", str(tiny_weights_path))
    assert code == 0 and "sparsity:      0.0000 of the weights are zero" in out and "pruned:" not in out


def test_cli_prune_bad_combination_is_one_line_and_exit_2(tmp_path, capsys, tiny_weights_path):
    code, out, err = _run(capsys, "prune", "--pattern", "2:4", "--sparsity", "0.9", str(tiny_weights_path),
                          str(tmp_path / "x.safetensors"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "--sparsity 0.5" in err
    assert not (tmp_path / "x.safetensors").exists()
