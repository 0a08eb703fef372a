"""How the MPI tests start these scripts (and `vggserve batch`): `mpiexec -n N` from PATH, with the repository
importable. Imported by the tests as `mpi_scripts.launch` (tests/ is on sys.path under pytest)."""

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def mpiexec(ranks) -> list[str]:
    """[mpiexec, "-n", ranks]; fails the test when MPICH's mpiexec is not installed."""
    launcher = shutil.which("mpiexec")
    assert launcher, "mpiexec not found: install the `mpich` package (pip install mpich)"
    return [launcher, "-n", str(ranks)]


def subprocess_env() -> dict:
    """This process's environment with the repository first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
