"""wgmma with the weights in registers (kernels/conv_wg_halo.cl, vggserve/ops/wgmma_halo.py): the weights are
wgmma's A, loaded as mma.sync A fragments; the block's pixels are its N, read through a descriptor from the patch's
planes of 16-byte pieces.

On an H100/H200 (VGGSERVE_TEST_DEVICE=gpu, VGGSERVE_WGMMA=1) the layers run real wgmma from the driver's patched PTX;
here and in CI on PoCL through wgmma.clh's software model, which reads the patch through the same layout the
descriptor describes (WG_LBO, WG_SBO) and takes A from the packed fragments. Each case against numpy on awkward sizes.
"""

import numpy as np
import pytest

from vggserve.ops import registry
from vggserve.ops.registry import LayerSpec
from vggserve.ops.tensorcore import tc_weights
from vggserve.ops.wgmma_halo import TILES, WgmmaHaloLayer, layout_defines, pack_fragments, valid
from vggserve.runtime import ptx

from clbuffers import rel_err
from test_tc_pool import check_pool_case
from test_tensorcore import TC_PRECISIONS, run_layer, tc_env  # noqa: F401 - the fixture

# (n, cin, cout, h, w): one image and three, channels below a chunk and past it (two and three chunks: the patch
# buffers reused), cout not a multiple of 64 or of 8, images smaller than a block, odd sides cut by the block's edges
SHAPES = [(1, 3, 8, 5, 7), (2, 13, 21, 6, 5), (1, 40, 70, 9, 4), (1, 70, 20, 17, 11), (3, 8, 130, 1, 1)]
IDS = "th{}_wg{}".format


def params(tile):
    p = dict(zip(("TH", "WGS"), tile), ALGO="wgmma_halo")
    assert valid(p)
    return p


def make(p):
    return lambda ctx, cache, prec, layer, w, b, env: WgmmaHaloLayer(ctx, cache, p, prec, layer, w, b, env)


def test_fragments_hold_mma_sync_a_layout(rng):
    """Lane (g, t4) of warp w: 4-byte unit t4 of rows 16 w + g, + 8, then unit t4 + 4 of both, per k-step of 32 bytes
    of tap t's chunk c (a model written from the PTX ISA's fragment figure, element by element)."""
    cout, cin = 70, 40
    w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    from vggserve.ops import precision as precisions

    prec = precisions.get("fp16")
    cpadk, npad = 64, 128
    wt = tc_weights(w, cpadk, npad, 9 * cpadk, prec).astype(np.float16)
    frags = pack_fragments(wt, cpadk, 2).reshape(npad // 64, cpadk // 32, 9, 2, 4, 32, 4)
    units = wt.view(np.uint32)
    for m, c, t, ks, warp, lane in [(0, 0, 0, 0, 0, 0), (1, 1, 8, 1, 3, 31), (0, 1, 4, 0, 2, 13), (1, 0, 5, 1, 1, 6)]:
        g, t4 = lane // 4, lane % 4
        row = 64 * m + 16 * warp + g
        base = (t * cpadk + c * 32) // 2 + 8 * ks  # 4-byte units: tap, chunk of 32 halves, k-step of 16 halves
        want = [units[row, base + t4], units[row + 8, base + t4], units[row, base + t4 + 4],
                units[row + 8, base + t4 + 4]]
        assert list(frags[m, c, t, ks, warp, lane]) == want
    # every weight lands once: the packing is a permutation
    assert sorted(frags.reshape(-1).tolist()) == sorted(units.reshape(-1).tolist())


def test_the_patch_layout_names_its_descriptor_advance_and_the_patch_advances_by_it():
    d = layout_defines(16)
    assert d == {"BN": 128, "WG_LBO": 16 * 180, "WG_SBO": 160, "WG_ADV": 360}
    body = "\n".join([f"add.f32 %f{i}, %f{i}, 0f00000000;" for i in range(64)]
                     + [f"or.b32 z, %r{i}, 0;" for i in range(8)] + ["mov.b64 t, %rd1;", "mov.b32 z, %r9;"])
    text = ".version 8.0\n.target sm_90\n{ // SLOT_WGSTAGE_RA_N128_KB64_F16_ADV360\n" + body + "\n}\n"
    out = ptx.patch(text)
    assert "add.s64 %wb, %wb, 360;" in out and out.count("wgmma.mma_async") == 2 and ".target sm_90a" in out
    plain = ptx.patch(text.replace("_ADV360", ""))
    assert "add.s64 %wb, %wb, 16;" in plain


# every tile at FP16; at TF32 (the same bytes, other fragments' contents) one and two warpgroups, 14 to 28 rows
CASES = ([("fp16", t) for t in TILES] + [("tf32", t) for t in [(16, 1), (28, 2), (14, 1)]])


@pytest.mark.parametrize("prec,tile", [(next(p for p in TC_PRECISIONS if p.name == n), t) for n, t in CASES],
                         ids=lambda c: c.name if hasattr(c, "name") else IDS(*c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_halo_layer_matches_numpy(tc_env, rng, prec, tile, shape):
    got, ref, _ = run_layer(tc_env, prec, None, (*shape, 3), rng, make=make(params(tile)))
    cout = shape[2]
    assert not np.isnan(got).any(), "an output element was never written"
    assert np.all(got[..., cout:] == 0), "the padding channels must be zero (the next layer reads them)"
    assert rel_err(got[..., :cout].transpose(0, 3, 1, 2), ref) < 2e-3


POOL_SHAPES = [(1, 3, 8, 5, 7), (3, 13, 21, 11, 17), (2, 16, 16, 1, 3), (1, 40, 70, 9, 4)]


@pytest.mark.parametrize("prec", TC_PRECISIONS, ids=str)
@pytest.mark.parametrize("tile", [(8, 1), (24, 2)], ids=lambda t: IDS(*t))
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_halo_fused_pool_matches_numpy_and_the_unfused_layer(tc_env, rng, prec, tile, shape):
    """A 2x2 window is columns 2 t4, 2 t4 + 1 of pixel tiles j, j + 1 of one lane."""
    p = params(tile)
    assert registry.get("wgmma_halo").fuses_pool(p)
    check_pool_case(tc_env, rng, prec, p, shape, WgmmaHaloLayer)


def test_wgmma_halo_is_offered_by_default_where_the_device_has_wgmma(monkeypatch):
    """Natively on compute capability 9.0 without VGGSERVE_WGMMA (the older wgmma entries still need it =1), never on
    another GPU, off with VGGSERVE_WGMMA=0; emulated on PoCL."""
    from vggserve.ops import precision as precisions
    from vggserve.runtime import caps as device_caps
    from test_wgmma import Device

    monkeypatch.delenv("VGGSERVE_EMULATE_MMA", raising=False)
    monkeypatch.delenv("VGGSERVE_WGMMA", raising=False)
    mine, old = registry.get("wgmma_halo"), registry.get("tc_halo_wgmma")
    hopper = device_caps.of(Device((9, 0)), "gpu", "H200")
    assert mine.available(hopper, precisions.FP16) and mine.available(hopper, precisions.TF32)
    assert not old.available(hopper, precisions.FP16)
    assert mine.available(hopper, precisions.get("fp8")) and mine.available(hopper, precisions.get("int8"))
    conv = LayerSpec("conv3x3", 64, 64, 56)
    assert "wgmma_halo" in {a.name for a in registry.for_layer(hopper, precisions.FP16, conv)}
    for cc in ((8, 0), (8, 9), (10, 0)):
        assert not mine.available(device_caps.of(Device(cc), "gpu", "GPU"), precisions.FP16)
    monkeypatch.setenv("VGGSERVE_WGMMA", "1")
    assert old.available(device_caps.of(Device((9, 0)), "gpu", "H100"), precisions.FP16)
    monkeypatch.setenv("VGGSERVE_WGMMA", "0")
    assert not mine.available(device_caps.of(Device((9, 0)), "gpu", "H100"), precisions.FP16)
    pocl = Device((0, 0))
    pocl.extensions = ""  # no NVIDIA attributes: a CPU, the software model
    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    monkeypatch.delenv("VGGSERVE_WGMMA")
    assert mine.available(device_caps.of(pocl, "cpu", "PoCL"), precisions.FP16)


def test_every_tile_fits_48_kb_and_one_work_group():
    from vggserve.ops import precision as precisions
    from vggserve.runtime import caps as device_caps

    caps = device_caps.Caps(kind="gpu", label="H200", compute_units=132, local_mem=48 * 1024, max_work_group=1024,
                            tensor_cores=True, emulate_mma=False, wgmma=True)
    algo = registry.get("wgmma_halo")
    cands = algo.candidates(caps, precisions.FP16, LayerSpec("conv3x3", 512, 512, 28))
    assert [(p["TH"], p["WGS"]) for p in cands] == TILES
    assert all(algo.local_mem(p, precisions.FP16) <= 48 * 1024 for p in cands)
    assert not valid({"TH": 12, "WGS": 1}) and not valid({"TH": 16, "WGS": 3})


def network_table(tiny_tensors, tile):
    """A tuned table putting every 3x3 layer after features.0 on wgmma_halo, its pooling fused where one follows."""
    from vggserve.runtime.params import shape_key
    from vggserve.weights.spec import infer_width, vgg16_spec

    spec, size, table = vgg16_spec(infer_width(tiny_tensors)), 224, {}
    for c in spec.convs:
        table[shape_key(c.cin, c.cout, size) + ("+pool" if c.pool_after else "")] = {
            **params(tile), **({"FUSE_POOL": 1} if c.pool_after else {})}
        size //= 2 if c.pool_after else 1
    return table


@pytest.mark.parametrize("precision,tile", [("fp16", (14, 2)), ("tf32", (28, 1))])
def test_the_whole_network_on_wgmma_halo_fuses_the_poolings_and_matches_float64(tiny_tensors, monkeypatch, precision,
                                                                                 tile):
    """Every 3x3 layer but features.0 on wgmma_halo through the tuned table (as the H200's), each pooling in the store
    of the convolution before it; the FC layers on tc_gemm. Against the float64 reference."""
    from vggserve.model.reference import reference_logits
    from test_wgmma import model_on_wgmma

    monkeypatch.setenv("VGGSERVE_WGMMA", "")  # the default: wgmma_halo needs no opt-in
    table = {f"conv_by_batch_{precision}": {"2": network_table(tiny_tensors, tile)}}
    x = np.random.default_rng(6).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with model_on_wgmma(tiny_tensors, monkeypatch, precision, tables=table, every_layer=False) as model:
        plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
        out = model.logits(x)
    convs = [k for name, k in plan.items() if name.startswith("features.")]
    assert len(convs) == 13 and convs[0].startswith("conv_first"), plan
    assert all(k.startswith(f"wgmma_halo {tile[0]}x8") for k in convs[1:]), plan
    assert sum("max-pool in the store" in k for k in convs) == 5 and not any("pool after" in n for n in plan), plan
    assert all(plan[f"classifier.{i}"].startswith("tc_gemm") for i in (0, 3, 6)), plan
    ref = reference_logits(tiny_tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2


def test_a_wgmma_halo_program_that_fails_to_build_gives_way_to_the_default_with_one_logged_line(tiny_tensors,
                                                                                              monkeypatch, caplog):
    from vggserve.errors import KernelBuildError
    from vggserve.model.reference import reference_logits
    from test_wgmma import model_on_wgmma

    def refuse(self, cache, env, defines):
        raise KernelBuildError("building the PTX program of kernels/conv_wg_halo.cl failed: ptxas error (a test)")

    monkeypatch.setattr(WgmmaHaloLayer, "program", refuse)
    table = {"conv_by_batch_fp16": {"1": network_table(tiny_tensors, (14, 1))}}
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with caplog.at_level("WARNING", logger="vggserve.model"):
        with model_on_wgmma(tiny_tensors, monkeypatch, "fp16", tables=table, every_layer=False, batch=1) as model:
            plan = {p["name"]: p["kernel"] for p in model.kernel_plan()}
            out = model.logits(x)
    convs = [k for name, k in plan.items() if name.startswith("features.")][1:]
    assert all(k.startswith("tc_gemm") and "wgmma_halo failed to build" in k for k in convs), plan
    lines = [r.getMessage() for r in caplog.records if "wgmma_halo" in r.getMessage()]
    assert len(lines) == 12 and all("conv_wg_halo.cl" in m for m in lines), lines  # one line per layer
    ref = reference_logits(tiny_tensors, x)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
