"""Forward passes recorded once and replayed (engine/replay.py, ops.launch.Recording): the same kernels, arguments
and order as running the steps, so the answers are bit for bit those of the steps, at every precision, batch size,
lane and slot; a plan is recorded once per (lane, input buffer, batch size); every launch the steps make is in it;
profiled passes run the steps; what a recording cannot hold runs directly."""

import ctypes

import numpy as np
import pyopencl as cl
import pytest

from conftest import TEST_DEVICE

from vggserve import VGG16
from vggserve.engine.replay import ENV, Plans
from vggserve.model.reference import reference_logits
from vggserve.ops.launch import Launch, NotRecordable, Recording


def inputs(seed, sizes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 3, 224, 224)).astype(np.float32) for n in sizes]


def count_launches(monkeypatch):
    """Every kernel enqueued through pyopencl, counted (replays go through ctypes and are not)."""
    seen = []
    original = cl.enqueue_nd_range_kernel

    def counted(queue, kernel, *a, **k):
        seen.append(kernel.function_name)
        return original(queue, kernel, *a, **k)

    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", counted)
    return seen


@pytest.fixture(scope="module")
def replayed_and_direct(tiny_weights_path):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4, lanes=2) as replayed, \
            VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4, lanes=2) as direct:
        direct.replay = False
        assert replayed.replay  # the default
        yield replayed, direct


def test_replayed_passes_match_the_steps_bit_for_bit_in_flight_on_both_lanes(replayed_and_direct, tiny_tensors):
    replayed, direct = replayed_and_direct
    batches = inputs(1, [1, 3, 4, 1, 1, 3, 2, 1])
    pending = [replayed.submit(x) for x in batches[:4]]  # four in flight: two per lane, every slot
    got = [p.result() for p in pending]
    got += [replayed.submit(x).result() for x in batches[4:]]
    want = [direct.logits(x) for x in batches]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert np.abs(got[1] - reference_logits(tiny_tensors, batches[1])).max() / np.abs(got[1]).max() < 1e-4
    assert len(direct.plans) == 0 and direct.plans.recorded == 0


def test_a_plan_is_recorded_once_per_lane_slot_and_batch_size(tiny_weights_path):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=2) as model:
        x1, x2 = inputs(2, [1, 2])
        for _ in range(3):
            model.logits(x1)  # one lane, two slots in turn
        assert model.plans.recorded == 2 and len(model.plans) == 2
        first = model.logits(x1)
        model.logits(x2)
        model.logits(x2)
        assert model.plans.recorded == 4  # batch 2 on both slots
        np.testing.assert_array_equal(model.logits(x1), first)
        assert model.plans.recorded == 4


def test_a_recording_holds_every_launch_the_steps_make(tiny_weights_path, monkeypatch):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=2) as model:
        model.replay = False
        x = inputs(3, [2])[0]
        model.logits(x)  # first pass: any lazy set-up out of the way
        seen = count_launches(monkeypatch)
        model.logits(x)
        steps_made = len(seen)
        model.replay = True
        seen.clear()
        model.logits(x)
        assert seen == []  # nothing escaped the recording into a real launch
        plan = model.plans.kept()[0]
        assert len(plan.launches) == steps_made > len(model.steps) // 2
        model.logits(x)  # the replay: no pyopencl launch at all
        assert seen == []


def test_probabilities_and_uint8_crops_replay_as_the_steps_run(replayed_and_direct):
    replayed, direct = replayed_and_direct
    crops = np.random.default_rng(4).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    x = inputs(5, [2])[0]
    for _ in range(2):
        np.testing.assert_array_equal(replayed.probabilities_from_pixels(crops), direct.probabilities_from_pixels(crops))
        np.testing.assert_array_equal(replayed.probabilities(x), direct.probabilities(x))


@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_tensor_core_precisions_replay_as_the_steps_run(precision, monkeypatch):
    from vggserve.quant.calibrate import from_histograms, observe
    from vggserve.weights.init import init_weights

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    tensors = init_weights(seed=3, width=0.0625)
    cal = None
    if precision == "fp8":
        hists, images = observe(tensors, inputs(11, [2]))
        cal = from_histograms(hists, images, "0" * 64, "max")
    x = inputs(6, [1])[0]
    with VGG16.load(tensors, device=TEST_DEVICE, max_batch_size=1, precision=precision, calibration=cal) as model:
        model.replay = False
        want = model.logits(x)
        model.replay = True
        for _ in range(3):  # recorded, then replayed from each slot
            np.testing.assert_array_equal(model.logits(x), want)
        assert model.plans.recorded == 2


def test_profiled_passes_run_the_steps(tiny_weights_path):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=1, profile=True) as model:
        times = model.layer_times(inputs(7, [1])[0])
        assert len(times) == len(model.steps) and model.plans.recorded == 0
        assert all(ms >= 0 for _, ms, _ in times)


def test_the_environment_turns_replay_off(tiny_weights_path, monkeypatch):
    monkeypatch.setenv(ENV, "0")
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=1) as model:
        assert model.replay is False
        model.logits(inputs(8, [1])[0])
        assert model.plans.recorded == 0


def test_a_recording_refuses_another_queue_and_event_waits_and_nesting(test_device):
    from vggserve.runtime import devices as devs

    ctx = cl.Context([devs.cl_device(devs.resolve(test_device))])
    q, other = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    prg = cl.Program(ctx, "__kernel void f(__global float *x, int n) { if (get_global_id(0) < n) x[0] += 1; }").build()
    launch = Launch(cl.Kernel(prg, "f"))
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
    with Recording(q) as rec:
        assert launch(q, (1,), None, buf, 1) is None
        with pytest.raises(NotRecordable, match="another queue"):
            launch(other, (1,), None, buf, 1)
        with pytest.raises(NotRecordable, match="waits for events"):
            launch(q, (1,), None, buf, 1, wait_for=[cl.enqueue_marker(other)])
        with pytest.raises(NotRecordable, match="already active"):
            Recording(q).__enter__()
    assert len(rec.launches) == 1
    ev = launch(q, (1,), None, buf, 1)  # outside the recording: a real launch again
    assert isinstance(ev, cl.Event)


def test_plans_run_directly_what_cannot_be_recorded_and_drop_the_least_recently_used(test_device):
    from vggserve.runtime import devices as devs

    ctx = cl.Context([devs.cl_device(devs.resolve(test_device))])
    q, other = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    prg = cl.Program(ctx, "__kernel void f(__global int *x, int v) { x[get_global_id(0)] += v; }").build()
    launch = Launch(cl.Kernel(prg, "f"))
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(4, np.int32))
    plans = Plans()
    plans.LIMIT = 2
    calls = []

    def steps(v, where=q):
        calls.append(v)
        launch(where, (4,), None, buf, v)
        launch(where, (4,), None, buf, 10 * v)

    for key, v in (("a", 1), ("b", 2), ("a", 1), ("c", 3)):  # "b" is dropped when "c" comes
        plans.run(key, q, lambda v=v: steps(v))
    q.finish()  # the two queues add into one buffer: "c" must land before "d" starts on the other queue
    plans.run("d", q, lambda: steps(100, where=other))  # not recordable: run directly, now and after
    other.finish()
    plans.run("d", q, lambda: steps(100, where=other))
    other.finish()
    got = np.empty(4, np.int32)
    cl.enqueue_copy(q, got, buf)
    assert (got == 2 * 11 + 22 + 33 + 2 * 1100).all()
    assert calls == [1, 2, 3, 100, 100, 100] and plans.recorded == 3 and len(plans) == 2
    assert plans.keys() == ["a", "c", "d"]  # "d" kept as not recordable


def test_plans_make_their_kernels_through_ctypes_and_through_pyopencl_alike(tiny_weights_path, monkeypatch):
    from vggserve.engine import replay
    from vggserve.runtime import clib

    x = inputs(9, [1])[0]
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=1) as model:
        want = model.logits(x)
        plan = model.plans.kept()[0]
        assert len(plan._raw) == len(plan.launches) and plan._kernels == []  # the ctypes route
        model.plans.clear()

        def refuse(*a, **k):
            raise clib.ArgumentError("as if an argument were of another kind")

        monkeypatch.setattr(clib, "kernel_with_args", refuse)
        np.testing.assert_array_equal(model.logits(x), want)
        plan = model.plans.kept()[0]
        assert plan._raw == [] and len(plan._kernels) == len(plan.launches)
        monkeypatch.setattr(replay.clib, "enqueue_nd_range_kernel", lambda: (_ for _ in ()).throw(OSError("none")))
        np.testing.assert_array_equal(model.logits(x), want)  # the other slot: no ctypes route, so the steps run
        np.testing.assert_array_equal(model.logits(x), want)
        assert len(model.plans) == 1 and len(model.plans.keys()) == 2  # that slot's pass kept as not recordable


def test_kernel_with_args_sets_every_kind_of_argument_and_refuses_others(test_device):
    from vggserve.runtime import clib, devices as devs

    ctx = cl.Context([devs.cl_device(devs.resolve(test_device))])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, """
        __kernel void f(__global float *out, __global const float *in, const int n, const float scale,
                        __local float *scratch) {
            const int i = get_global_id(0);
            scratch[get_local_id(0)] = in == 0 ? 1.0f : in[i];
            barrier(CLK_LOCAL_MEM_FENCE);
            if (i < n) out[i] = scratch[get_local_id(0)] * scale;
        }""").build()
    src = np.arange(8, dtype=np.float32)
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 32)
    inp = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=src)
    template = cl.Kernel(prg, "f")
    for given, want in ((inp, src * 2.5), (None, np.full(8, 2.5, np.float32))):
        handle = clib.kernel_with_args(template.program, "f", (out, given, 7, np.float32(2.5), cl.LocalMemory(32)))
        cl.enqueue_fill_buffer(q, out, np.float32(-1), 0, 32)
        eight = (ctypes.c_size_t * 1)(8)
        assert clib.enqueue_nd_range_kernel()(ctypes.c_void_p(q.int_ptr), handle, 1, None, eight, eight, 0, None,
                                              None) == 0
        got = np.empty(8, np.float32)
        cl.enqueue_copy(q, got, out)
        clib.release_kernel(handle)
        np.testing.assert_array_equal(got[:7], want[:7])
        assert got[7] == -1.0  # i < n
    with pytest.raises(clib.ArgumentError, match="argument 2 is a float"):
        clib.kernel_with_args(template.program, "f", (out, inp, 7.5, np.float32(1), cl.LocalMemory(32)))
    with pytest.raises(RuntimeError, match="clCreateKernel"):
        clib.kernel_with_args(template.program, "no_such_kernel", ())


def test_prepare_replays_records_every_size_on_every_slot_and_then_nothing_more(replayed_and_direct, monkeypatch):
    replayed, direct = replayed_and_direct  # two lanes, two slots each, batches of up to 4
    replayed.plans.clear()
    before = replayed.plans.recorded
    assert replayed.prepare_replays() == 2 * 2 * 4
    assert replayed.prepare_replays() == 0  # all there already
    made = replayed.plans.recorded
    assert made - before == 16
    for x in inputs(10, [1, 2, 3, 4, 3, 2, 1, 4, 2]):
        np.testing.assert_array_equal(replayed.logits(x), direct.logits(x))
    assert replayed.plans.recorded == made
    replayed.plans.clear()
    monkeypatch.setattr(replayed.plans, "LIMIT", 8)  # 16 would not fit: batch 1 and the full batch only
    assert replayed.prepare_replays() == 4 * 2
    direct_made = direct.prepare_replays()
    assert direct_made == 0 and direct.plans.recorded == 0  # replay off: nothing recorded


def test_a_service_workers_warm_up_records_every_batch_size(tiny_weights_path):
    from vggserve.serving.metrics import Metrics
    from vggserve.serving.scheduling.worker import DeviceWorker

    worker = DeviceWorker("cpu", None, None, Metrics(), max_batch_size=3, max_wait_s=0, warmup=True,
                          on_change=lambda: None, pixels=True)
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=3) as model:
        worker._warm_up(model)
        assert model.plans.recorded == len(model.slots) * 3 == 6
        crops = np.random.default_rng(11).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
        model.probabilities_from_pixels(crops)
        assert model.plans.recorded == 6  # batch 2 was recorded at the warm-up
