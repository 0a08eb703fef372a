"""`vggserve` command line: one module per subcommand, each with `register(subparsers)`.

A subcommand module adds its parser and sets `func` (called with the parsed args; returns an exit code).
Errors derived from VggserveError are printed as one line on stderr, never as a traceback. Program compiles that
take long are shown on stderr while they go on (buildlog.py).
"""

import argparse
import importlib
import sys

from ..distributed.stopping import Stopped, catch_stop_signals, stop_exit_code
from ..errors import VggserveError
from .buildlog import build_progress_on_stderr

# subcommand modules, in the order `vggserve --help` lists them
SUBCOMMANDS = ("classify", "devices", "weights", "calibrate", "bench", "batch", "serve", "loadtest", "tune")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="vggserve", description="VGG16 image classification on OpenCL.")
    parser.add_argument("--version", action="version", version=f"vggserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # subcommand not written yet
            raise
        module.register(sub)
    return parser


# commands that build a model on --device: they start OpenCL's discovery before importing the rest
MODEL_COMMANDS = {"classify": "auto", "bench": "auto", "batch": "auto", "serve": "all", "tune": "auto"}
# commands that end cleanly on SIGTERM (distributed/stopping.py): the handler goes in before OpenCL starts
STOPPABLE_COMMANDS = {"batch"}


def peek_device(argv: list[str]) -> tuple[str | None, str | None]:
    """(command, --device value or the command's default) from the raw arguments, before any parsing."""
    command = next((a for a in argv if not a.startswith("-")), None)
    device = MODEL_COMMANDS.get(command)
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            device = argv[i + 1]
        elif arg.startswith("--device="):
            device = arg.partition("=")[2]
    return command, device


def main(argv=None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    command, device = peek_device(words)
    if command in STOPPABLE_COMMANDS:
        catch_stop_signals()
    if command in MODEL_COMMANDS and not {"-h", "--help"} & set(words):
        from .. import start_device_discovery

        start_device_discovery(device)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with build_progress_on_stderr():  # a first start's compiles can take minutes: say so (cli/buildlog.py)
            return int(args.func(args) or 0)
    except VggserveError as exc:
        print(f"vggserve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("vggserve: interrupted", file=sys.stderr)
        return 130
    except Stopped as exc:  # before the command's own handling began
        print(f"vggserve: {exc}", file=sys.stderr)
        return stop_exit_code(exc)
    except BrokenPipeError:
        return 0
