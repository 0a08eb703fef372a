"""Stand-in decoders for benchmarks of the host's side: a decode task for the consumer's side of the decode processes
(`DecodeJob(task=REPLAY)`), and `stand_in_device_decoder` for a service's front ends in front of a GPU.

`replay` decodes the first source a process is sent, as the real task does, and answers every later source with a
copy of that model input (a benchmark's images are all alike: 500x375 JPEGs): it is copied into a fresh block of
shared memory, which costs the process
about a twentieth of a decode (plus, if the environment sets REPLAY_MS, that long asleep: the wall time of a decode
without its CPU). The decode processes then keep up with far more images per second than a rank can
take, so a benchmark measures the rank's own work (`benchmarks/batch_host_floor.py --replay`).
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..decoding.worker import decode_task
from ..modelinput import CROP_SHAPE, ModelInput

REPLAY = "vggserve.testing.decoding:replay"
#: environment variable: milliseconds each replayed image takes in wall time (asleep: no CPU), to stand in for the
#: decode time of many processes on a machine with few cores
REPLAY_MS = "VGGSERVE_REPLAY_MS"
_first: list = []  # the first model input this process made


def replay(source, job, allocate, clock):
    """The model input of the first source this process decoded (with `decode_task`), copied into `allocate`'s
    block."""
    if not _first:
        made = decode_task(source, job, None, clock)
        _first.append(ModelInput(made.form, np.array(made.array)))
        return made
    first = _first[0]
    time.sleep(float(os.environ.get(REPLAY_MS, 0)) / 1000)
    with clock("copy"):
        block = allocate(first.array.shape, first.array.dtype) if allocate is not None else None
        if block is None:
            return first
        np.copyto(block, first.array)
    return ModelInput(first.form, block)


def stand_in_device_decoder() -> None:
    """In this process (a service's engine process), from now on: every device worker says it decodes on its device,
    so the front ends send JPEGs compressed, and 'decodes' each into one blank crop at once, counted as the device
    decoder counts. The front ends then do what they do in front of a GPU under --decode gpu, on any machine
    (`benchmarks/serve_host_floor.py --decode gpu` without --weights); the engine's own work is not the decoder's."""
    from ..serving.scheduling import devicedecode, worker

    crop = ModelInput.crop(np.zeros(CROP_SHAPE, np.uint8))

    def decoded(self, model, datas, batches=1):
        self.note(devicedecode.DEVICE, devicedecode.ON_DEVICE, len(datas))
        return [crop] * len(datas)

    worker.decodes_on_device = lambda model, mode: True
    devicedecode.DeviceDecoding._on_device = decoded
