"""Stand-in decode tasks for the decode-process tests (tests/ is on the decode processes' PYTHONPATH there):
`crash_or_hang` decodes as usual, except that a file named *crash* kills its process at once (as a crash inside a
decoder would) and one named *hang* never finishes. Point vggserve.decoding.worker.DEFAULT_TASK here."""

import os
import signal
import time

from vggserve.decoding.worker import decode_task

TASK = "decode_faults:crash_or_hang"


def crash_or_hang(source, job, allocate, clock):
    name = os.path.basename(str(source))
    if "crash" in name:
        os.kill(os.getpid(), signal.SIGKILL)
    if "hang" in name:
        time.sleep(3600)
    return decode_task(source, job, allocate, clock)
