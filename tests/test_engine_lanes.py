"""Lanes (engine.py): several forward passes in flight on queues of their own, sharing the weights. The answers are
those of one lane, bit for bit, whatever the order batches are submitted and collected in; every lane has its own
queue, activation buffers and scratch (ops.launch.PerQueue); and Launch keeps a kernel copy per argument set, so
batches alternating between slots and lanes set no argument."""

import numpy as np
import pyopencl as cl
import pytest

from conftest import TEST_DEVICE

from vggserve import VGG16
from vggserve.errors import SettingError
from vggserve.model.reference import reference_logits
from vggserve.ops.launch import Launch, PerQueue


def inputs(seed, sizes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 3, 224, 224)).astype(np.float32) for n in sizes]


def max_rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def one_and_two_lanes(tiny_weights_path):
    with VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4) as one, \
            VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=4, lanes=2) as two:
        yield one, two


def test_two_lanes_give_one_lanes_answers_bit_for_bit_with_four_batches_in_flight(one_and_two_lanes, tiny_tensors):
    one, two = one_and_two_lanes
    batches = inputs(1, [1, 3, 4, 2, 1, 4, 3])
    expected = [one.logits(x) for x in batches]
    pending = [two.submit(x) for x in batches[:4]]  # four in flight: two per lane
    got = [p.result() for p in reversed(pending)][::-1]  # collected out of order
    pending = [two.submit(x) for x in batches[4:]]
    got += [p.result() for p in pending]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    ref = reference_logits(tiny_tensors, batches[1])
    assert max_rel_err(got[1], ref) < 1e-4


def test_probabilities_and_uint8_crops_on_two_lanes_match_one_lane(one_and_two_lanes):
    one, two = one_and_two_lanes
    crops = np.random.default_rng(2).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    x = inputs(3, [2])[0]
    a = two.submit(crops, want="probabilities")
    b = two.submit(x, want="probabilities")
    np.testing.assert_array_equal(a.result(), one.probabilities_from_pixels(crops))
    np.testing.assert_array_equal(b.result(), one.probabilities(x))


def test_batches_go_to_the_lanes_in_turn_each_with_its_own_queue_and_buffers(one_and_two_lanes):
    _, two = one_and_two_lanes
    assert len(two.lanes) == 2 and len(two.slots) == 4
    assert [two.slots[i].lane for i in range(4)] == [two.lanes[0], two.lanes[1], two.lanes[0], two.lanes[1]]
    a, b = two.lanes
    assert a.queue is not b.queue and a.queue is two.queue
    mine = {id(x) for x in (a.ping, a.pong, a.logits, a.probs)}
    assert not mine & {id(x) for x in (b.ping, b.pong, b.logits, b.probs)}
    assert a.ping != b.ping and a.logits != b.logits


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_tensor_core_layers_with_split_k_on_two_lanes_match_one_lane(tiny_weights_path, tiny_tensors, monkeypatch,
                                                                     precision):
    """At batch 1 the deep layers split K (their partial sums: a PerQueue, one buffer per queue)."""
    from vggserve.quant.calibrate import from_histograms, observe

    monkeypatch.setenv("VGGSERVE_EMULATE_MMA", "1")
    cal = None
    if precision == "int8":
        hists, images = observe(tiny_tensors, inputs(11, [2]))
        cal = from_histograms(hists, images, "0" * 64, "max")
    batches = inputs(4, [1, 1, 1, 1])
    with VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1, precision=precision, calibration=cal) as one:
        expected = [one.logits(x) for x in batches]
    with VGG16.load(tiny_tensors, device=TEST_DEVICE, max_batch_size=1, precision=precision, calibration=cal,
                    lanes=2) as two:
        pending = [two.submit(x) for x in batches]
        for p, e in zip(pending, expected):
            np.testing.assert_array_equal(p.result(), e)
        splitting = split_workspaces(two)
        assert splitting and all(len(ws.buffers) == 2 for ws in splitting)


def split_workspaces(model) -> list:
    """The split-K partial-sum workspaces of the model's layers that split K."""
    found = []
    for step in model.steps:
        op = getattr(step.run, "__self__", None) or (step.run.args[0] if hasattr(step.run, "args") else None)
        if getattr(op, "split_kernel", None) is not None:
            found.append(op.ws)
    return found


@pytest.mark.parametrize("lanes", [0, 5, True, "2", 1.5])
def test_a_bad_lane_count_is_a_one_line_error(tiny_weights_path, lanes):
    with pytest.raises(SettingError, match=r"^lanes must be an integer from 1 to 4, got ") as info:
        VGG16.load(tiny_weights_path, device=TEST_DEVICE, max_batch_size=1, lanes=lanes)
    assert "\n" not in str(info.value)


def test_per_queue_buffers_are_one_per_queue_kept_and_remade_when_grown():
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(TEST_DEVICE))
    ctx = cl.Context([dev])
    q1, q2 = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    per = PerQueue(ctx, 64)
    a, b = per.get(q1), per.get(q2)
    assert a != b and per.get(q1) is a and per.get(q2) is b and a.size == 64
    per.reserve(32)  # smaller: kept
    assert per.get(q1) is a
    per.reserve(256)  # larger: remade at the new size
    c = per.get(q1)
    assert c.size == 256 and len(per.buffers) == 1
    per.release()
    assert per.buffers == {}


def test_launch_keeps_a_kernel_per_argument_set_and_reuses_the_least_recent_past_its_copies():
    from vggserve.runtime import devices as devs

    dev = devs.cl_device(devs.resolve(TEST_DEVICE))
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, "__kernel void put(__global int *x, const int v) { x[get_global_id(0)] = v; }").build()
    launch = Launch(cl.Kernel(prg, "put"))
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4) for _ in range(Launch.COPIES + 2)]
    for _ in range(3):  # alternating two buffers: two kernel objects, each keeping its arguments
        launch(q, (4,), None, bufs[0], 7)
        launch(q, (4,), None, bufs[1], 9)
    assert len(launch.copies) == 2 and launch.copies[0][0] == (bufs[1], 9)
    for i, buf in enumerate(bufs):  # more argument sets than copies: the least recently used ones are reused
        launch(q, (4,), None, buf, 100 + i)
    assert len(launch.copies) == Launch.COPIES
    launch(q, (4,), None, bufs[0], 5)  # an argument set that was pushed out comes back with its own values
    out = np.empty(4, np.int32)
    values = [5] + [100 + i for i in range(1, len(bufs))]
    for buf, v in zip(bufs, values):
        cl.enqueue_copy(q, out, buf)
        assert (out == v).all()
