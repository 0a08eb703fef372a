"""`vggserve batch` whose decode processes crash on files named *crash* and hang on files named *hang*
(tests/decode_faults.py; tests/ must be on PYTHONPATH so that the decode processes find it).

    mpiexec -n 2 python batch_with_faulty_decoder.py --weights W --input DIR --output OUT --decode-timeout 2

Used by tests/test_batch_mpi.py to check that such images become error lines and the job finishes.
"""

import sys

import vggserve.decoding.worker as worker
from vggserve.cli import main

if __name__ == "__main__":
    worker.DEFAULT_TASK = "decode_faults:crash_or_hang"
    sys.exit(main(["batch", *sys.argv[1:]]))
