"""The command of a child process that runs one of vggserve's modules in a fresh interpreter (no OpenCL state, no
threads inherited): the decode processes, the HTTP front ends, the engine processes.

    subprocess.Popen(child_command("vggserve.decoding.worker", str(fd)), pass_fds=(fd,))

The child imports vggserve from this checkout or installation (its root first on sys.path), whatever the working
directory, and exits with the status `main()` returns.
"""

import sys
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def child_command(module: str, *args: str) -> list[str]:
    """[python, -c, code, root, *args]: run `module`.main() in a fresh interpreter (its sys.argv[2:] are `args`)."""
    code = ("import sys; root = sys.argv[1]; sys.path.insert(0, root) if root not in sys.path else None; "
            f"from {module} import main; sys.exit(main())")
    return [sys.executable, "-c", code, PACKAGE_ROOT, *args]
