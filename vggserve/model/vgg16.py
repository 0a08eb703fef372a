"""VGG16 on the engine: its graph (13 convolutions, 5 poolings, 3 fully connected layers) as engine steps.

    model = VGG16.load("vgg16.safetensors", device="auto", max_batch_size=16, precision="fp32")
    model = VGG16.load("vgg16.safetensors", precision="int8")   # scales from vgg16.safetensors.int8.json
    model.logits(x)                 # (N, 3, 224, 224) float32, normalised -> (N, 1000) float32
    model.probabilities_from_pixels(px)  # (N, 224, 224, 3) uint8 RGB crops, normalised on the device
    model.classify(["cat.jpg"], 5)  # -> [[{"index", "label", "probability"}, ...]]
    pending = model.submit(x); ...; pending.result()  # streaming: the next upload overlaps this batch's kernels

Each layer's kernel comes from the algorithm registry (ops/registry.py): the tuned table's winner for its shape,
batch and precision, else its family's default; on pruned weights, a sparse entry where the layer's measured
sparsity makes it win (ops/sparse_select.py, docs/sparse.md). The family follows the precision and the device
(`registry.family_for`): the portable kernels on NCHW storage (FP32, or FP16 storage with FP32 math), or the
tensor-core kernels on NHWC storage (TF32, FP16, FP8, INT8). Weights are re-laid out for the kernels once, at load.
At FP8 and INT8 the weights are quantised at load and the activation scales come from the calibration beside the
weights (`<weights>.fp8.json`, `.int8.json`; model/eightbit.py says which layers stay FP16); the 8-bit layers run on
the dense tensor-core entries only (no 2:4 kernel takes 8-bit operands).
A convolution followed by a 2x2 max-pool runs as one step ("features.2+pool") where its entry can fuse the pooling
into its store (`registry.pool_fused`: tc_halo at FP16 and TF32, and on 2:4 weights tc_halo_sparse24); the pooling
step then disappears.
"""

import logging
import time
from dataclasses import replace
from functools import partial

from ..engine.engine import Engine, Step, StartupTimes  # noqa: F401 - re-exported
from ..errors import KernelBuildError
from ..ops import first_conv, nhwc, registry, sparse_select
from ..ops.launch import round_up
from ..ops.pool import KERNEL_FILE as POOL_FILE, MaxPool
from ..ops.precision import storage_defines
from ..ops.registry import BuildEnv, LayerSpec
from ..ops.relayout import KERNEL_FILE as RELAYOUT_FILE, DeviceRelayout, defines as relayout_defines
from ..ops.tensorcore import nhwc_fc_weights, vec
from ..runtime.params import conv_params_for, nearest_table, shape_key, table_key
from ..weights.spec import INPUT_SIZE, POOLED_SIZE, infer_width, vgg16_spec
from .eightbit import LayerPlan, layer_plans

log = logging.getLogger("vggserve.model")


def activation_sizes(spec) -> list[int]:
    """Values per image of every activation the portable (NCHW) forward pass writes."""
    sizes, size = [], INPUT_SIZE
    for c in spec.convs:
        sizes.append(c.cout * size * size)
        if c.pool_after:
            size //= 2
            sizes.append(c.cout * size * size)
    return sizes + [f.fout for f in spec.fcs]


class VGG16(Engine):
    def __init__(self, tensors: dict, device: str = "auto", max_batch_size: int = 16, profile: bool = False,
                 preprocessing: str = "torchvision", program_dir=None, precision: str = "fp32", calibration=None,
                 lanes: int = 1):
        """program_dir: where compiled programs are cached (default: `programs.cache_dir()`); calibration: the
        activation ranges (quant/calibration.Calibration, or a function that reads them, called once the device is
        known to run the precision) an 8-bit precision needs; lanes: forward passes that may run on the device at
        once (engine.py)."""
        super().__init__(device, max_batch_size, profile, preprocessing, program_dir, precision,
                         lanes)  # checks the device
        self.spec = vgg16_spec(infer_width(tensors))
        self.calibration = calibration() if callable(calibration) else calibration
        if self.precision.eight_bit and self.calibration is None:
            from ..errors import CalibrationError

            raise CalibrationError(f"precision {self.precision} needs activation scales: load the weights from a file "
                                   f"with its calibration beside it (`vggserve calibrate --precision "
                                   f"{self.precision}`), or pass calibration=")
        self.family = registry.family_for(self.caps, self.precision)
        t1, built = time.perf_counter(), self.program_cache.seconds
        self._build(tensors)
        self._allocate()
        self._finish_startup(t1, built)

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def load(cls, weights, device: str = "auto", max_batch_size: int = 16, profile: bool = False,
             program_dir=None, precision: str = "fp32", calibration=None, lanes: int = 1) -> "VGG16":
        """From a weights file (any supported format) or a dict of arrays (any supported key scheme).
        precision: "fp32" (default), "tf32", "fp16", "fp8" or "int8" (ops/precision.py). fp8 and int8 read the
        calibration beside a weights file (`<file>.fp8.json`, `<file>.int8.json`; a CalibrationError in one line,
        saying how to make it, where there is none) unless `calibration` (a quant.calibration.Calibration) is given;
        weights given as arrays need `calibration`. lanes: forward passes that may run on the device at once (1, the
        default, to 4): two help small batches on a GPU (engine.py)."""
        from ..ops import precision as precisions
        from ..quant.calibration import load_for
        from ..weights import load_weights, weights_from_tensors

        loaded = weights_from_tensors(weights) if isinstance(weights, dict) else load_weights(weights)
        prec = precisions.get(precision)
        if prec.eight_bit and calibration is None and loaded.path is not None:
            calibration = partial(load_for, loaded.path, loaded.sha256, prec.name)  # after the device's check
        model = cls(loaded.tensors, device, max_batch_size, profile, preprocessing=loaded.preprocessing,
                    program_dir=program_dir, precision=precision, calibration=calibration, lanes=lanes)
        model._weights_loaded = loaded  # only for its lazily computed, cached sha256; tensors dropped below
        loaded.tensors = {}
        return model

    @property
    def weights_info(self) -> dict:
        """Where the weights came from: path, format, key_scheme, width, sha256 (hashed on first access)."""
        loaded = getattr(self, "_weights_loaded", None)
        if loaded is None:  # constructed directly from arrays
            return {"path": None, "format": "memory", "key_scheme": "torchvision", "width": self.spec.width,
                    "sha256": None}
        return {"path": None if loaded.path is None else str(loaded.path), "format": loaded.format,
                "key_scheme": loaded.key_scheme, "width": loaded.width, "sha256": loaded.sha256}

    def _layer_params(self, layer: LayerSpec, pool: bool = False, prec=None) -> tuple[dict, str]:
        """(parameters, where they came from) for one layer; pool: a 2x2 max-pool follows it; prec: the layer's
        precision where it is not the model's (an FP16 layer of an 8-bit model)."""
        prec = prec or self.precision
        default = registry.get(registry.DEFAULT_ALGO[self.family]).default(self.caps, prec)
        key = table_key(prec.name)
        tuned = nearest_table(self.params, self.max_batch_size, prec.name)  # what conv_params_for reads
        p = conv_params_for(self.params, layer.cin, layer.cout, layer.size, self.max_batch_size,
                            prec.name, default=default, pool=pool)
        if pool and shape_key(layer.cin, layer.cout, layer.size, pool=True) in tuned:
            why = f"tuned for this shape followed by a pool ({key})"
        elif layer.shape_key in tuned:
            why = f"tuned for this shape ({key})"
        else:
            why = "family default (no tuned entry)"
        named = p.get("ALGO", registry.DEFAULT_ALGO[self.family])
        try:
            chosen = registry.choose(p, self.family, layer.kind)
            fits = chosen.name == named
        except ValueError:  # an algorithm this version does not know
            fits = False
        if not fits:  # e.g. a tensor-core winner tuned with VGGSERVE_EMULATE_MMA=1, read by a portable start
            return default, f"family default (the tuned entry is {named}, not a {self.family} {layer.kind} kernel)"
        if not chosen.available(self.caps, prec):  # e.g. wgmma turned off, or another GPU's table
            return default, f"family default (the tuned entry is {named}, which this device does not run)"
        if not chosen.suits(self.max_batch_size):  # e.g. tc_gemv from a batch-1 table in a model of 8 images
            return default, f"family default (the tuned entry is {named}, which does not pay at batch " \
                            f"{self.max_batch_size})"
        return p, why

    def _choose(self, layer: LayerSpec, weight, pool: bool = False, plan: LayerPlan | None = None) -> tuple:
        """(registry entry, parameters, why) for one layer: a sparse entry if the weights' measured sparsity makes
        one win (sparse_select), else the tuned or default dense one. pool: a 2x2 max-pool follows the layer;
        plan: the layer's 8-bit plan (a dense tensor-core entry at its precision)."""
        if plan is not None:
            p, why = self._layer_params(layer, pool, plan.precision)
            algo = registry.choose(p, self.family, layer.kind)
            if plan.codes.eight_bit and not algo.available(self.caps, plan.codes):  # e.g. FP16's wgmma winner
                default = registry.get(registry.DEFAULT_ALGO[self.family])  # for features.0, which writes codes
                why = f"family default ({algo.name} has no {plan.codes} kernels)"
                return default, default.default(self.caps, plan.precision), why
            return algo, p, why
        p, why = self._layer_params(layer, pool)
        sparse = sparse_select.for_layer(self.params, self.caps, self.precision, layer, weight, self.max_batch_size,
                                         pool=pool)
        if sparse.algo != sparse_select.DENSE and registry.get(sparse.algo).family == self.family:
            algo = registry.get(sparse.algo)
            table = sparse_select.sparse_table(self.params, self.caps.kind)
            params = {**algo.default(self.caps, self.precision), **table["params"].get(sparse.algo, {})}
            if (pool and algo.fuses_pool(params) and not self.caps.emulate_mma
                    and sparse_select.curve_key(table, layer, pool) == layer.shape_key):
                # a fused 2:4 pooled step runs natively only where this device's tuner has measured it and checked
                # it against float64 ("+pool" curves, sparse_tuning.measure_2_4); until then conv, then the pooling
                params["FUSE_POOL"] = 0
                return algo, params, f"{sparse.reason}; pooling not fused (no +pool curve measured on this device)"
            return algo, params, sparse.reason
        if sparse.reason:
            why = f"{why}; {sparse.reason}"
        return registry.choose(p, self.family, layer.kind), p, why

    def _make(self, algo, p: dict, why: str, layer: LayerSpec, pool_after: bool, weight, bias, env, prec=None,
              **extra):
        """(layer object, whether it pools, why) of `algo` with `p` at `prec` (default: the model's precision); a
        kernel that fails to build (a PTX program the driver refuses, runtime/ptx.py) gives way to the family's
        default with one logged line."""
        prec = prec or self.precision
        fused = pool_after and registry.pool_fused(algo, p)
        try:
            return (algo.make(self.context, self.program_cache, p, prec,
                              replace(layer, pool=True) if fused else layer, weight, bias, env, **extra), fused, why)
        except KernelBuildError as exc:
            default = registry.get(registry.DEFAULT_ALGO[self.family])
            if algo is default:
                raise
            log.warning("vggserve: %s for the %s layer %s failed to build, running %s instead: %s", algo.name,
                        layer.kind, layer.shape_key, default.name, exc)
            return self._make(default, default.default(self.caps, prec),
                              f"family default ({algo.name} failed to build)", layer, pool_after, weight, bias, env,
                              prec, **extra)

    def _build(self, tensors: dict) -> None:
        ctx, cache, prec = self.context, self.program_cache, self.precision
        relayout = DeviceRelayout(ctx, self.queue, cache.build(RELAYOUT_FILE, relayout_defines(prec.storage)),
                                  storage=prec.storage)
        env = BuildEnv(caps=self.caps, max_batch=self.max_batch_size, relayout=relayout, tables=self.params)
        tc = self.family == "tensorcore"
        plans = self._plans()
        steps, size = [], INPUT_SIZE
        self.convs, self.fcs = [], []  # (spec, op) per layer, for introspection
        direct = False  # features.0 on conv_first.cl, from the float32 NCHW input (no to_nhwc step)
        if tc:
            c0 = self.spec.convs[0]
            first = plans[c0.name].precision if plans else prec  # 8-bit: features.0 reads FP16
            direct = first_conv.fits(LayerSpec("conv3x3", c0.cin, c0.cout, size, relu=True, pool=c0.pool_after), first)
            programs = {}  # nhwc.cl per storage (8-bit: the pooling's byte max)
            if not direct:
                programs[first] = program = cache.build(nhwc.KERNEL_FILE, nhwc.defines(first))
                chans, item = round_up(3, vec(first)), first.itemsize  # the NHWC activation (padded to 16 bytes)
                to_nhwc = nhwc.NhwcInput(program, 3, chans)
                steps.append(Step("input to NHWC", partial(_run_sized, to_nhwc, size), _no_flops,
                                  size * size * chans * item, "nhwc.cl to_nhwc"))

            def new_pool(out):
                if out not in programs:
                    programs[out] = cache.build(nhwc.KERNEL_FILE, nhwc.defines(out))
                return nhwc.MaxPoolNhwc(programs[out], out)
        else:
            chans, item = 3, prec.itemsize
            pool_program = cache.build(POOL_FILE, storage_defines(prec))
            new_pool = lambda _: MaxPool(pool_program, {})  # noqa: E731
        for i, c in enumerate(self.spec.convs):
            layer = LayerSpec("conv3x3", c.cin, c.cout, size, relu=True)
            plan = plans.get(c.name)
            extra = ({} if tc else {"first": i == 0}) if plan is None else plan.kwargs
            if direct and i == 0:
                op, fused = first_conv.FirstConv(ctx, cache, first, layer, tensors[f"{c.name}.weight"],
                                                 tensors[f"{c.name}.bias"], env, **extra), False
                why = "the first convolution, from the float32 input"
            else:
                algo, p, why = self._choose(layer, tensors[f"{c.name}.weight"], pool=c.pool_after, plan=plan)
                op, fused, why = self._make(algo, p, why, layer, c.pool_after, tensors[f"{c.name}.weight"],
                                            tensors[f"{c.name}.bias"], env, plan and plan.precision, **extra)
            self.convs.append((c, op))
            out = _stored(op, prec) if tc else prec
            chans, item = (round_up(c.cout, vec(out)) if tc else c.cout), out.itemsize
            run, flops = partial(_run_sized, op, size), partial(_sized_flops, op, size)
            if fused:
                size //= 2
                steps.append(Step(f"{c.name}+pool", run, flops, size * size * chans * item, f"{op.describe()} ({why})"))
                continue
            steps.append(Step(c.name, run, flops, size * size * chans * item, f"{op.describe()} ({why})"))
            if c.pool_after:  # a kernel object per pooling step: its arguments then never change between calls
                run = partial(_run_pool, new_pool(out), chans, size)
                size //= 2
                steps.append(Step(f"pool after {c.name}", run, _no_flops, size * size * chans * item,
                                  "nhwc.cl maxpool_nhwc" if tc else "maxpool.cl"))
        for j, f in enumerate(self.spec.fcs):
            last = j == len(self.spec.fcs) - 1
            layer = LayerSpec("fc", f.fin, f.fout, 1, relu=f.relu, last=last)
            weight = tensors[f"{f.name}.weight"]
            plan = plans.get(f.name)
            algo, p, why = self._choose(layer, weight, plan=plan)
            extra = {} if plan is None else plan.kwargs
            if tc and j == 0:  # torchvision flattens NCHW; the NHWC activation needs the columns permuted
                weight = nhwc_fc_weights(weight, self.spec.convs[-1].cout, chans, POOLED_SIZE)
                extra = {**extra, "cpad": weight.shape[1]}
            op, _, why = self._make(algo, p, why, layer, False, weight, tensors[f"{f.name}.bias"], env,
                                    plan and plan.precision, **extra)
            self.fcs.append((f, op))
            out = _stored(op, prec) if tc else prec
            chans = round_up(f.fout, vec(out)) if tc else f.fout
            steps.append(Step(f.name, op.enqueue, partial(_fc_flops, f.fin, f.fout), chans * out.itemsize,
                              f"{op.describe()} ({why})"))
        relayout.close()
        self.steps = steps

    def _plans(self) -> dict[str, LayerPlan]:
        """Each layer's 8-bit plan (model/eightbit.py) at FP8 or INT8; empty at the other precisions."""
        if not self.precision.eight_bit:
            return {}
        names = [c.name for c in self.spec.convs] + [f.name for f in self.spec.fcs]
        return layer_plans(self.precision, self.calibration, names)


def _stored(op, prec):
    """The storage of a tensor-core layer's output: its 8-bit scales' (FP16 past an 8-bit layer, or its codes), else
    the model's precision (the last layer's logits count as the precision's; the engine reads them as float32)."""
    scales = getattr(op, "scales", None)
    out = scales.out_precision if scales is not None and scales.active else None
    return out or prec.floats


def _run_sized(op, size, queue, src, dst, n):
    return op.enqueue(queue, src, dst, n, size, size)


def _run_pool(pool, channels, size, queue, src, dst, n):
    return pool.enqueue(queue, src, dst, n, channels, size, size)


def _sized_flops(op, size, n):
    return op.flops(n, size, size)


def _fc_flops(fin, fout, n):
    return 2.0 * n * fin * fout


def _no_flops(n):
    return 0.0
