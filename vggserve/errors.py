"""Exceptions users see. Each message names the cause and, where there is one, the fix."""


class VggserveError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""

    exit_code = 1


class SettingError(VggserveError, ValueError):
    """A setting the model cannot run with (a ValueError to Python callers, one line and exit 2 on the CLI)."""

    exit_code = 2


class DeviceError(VggserveError):
    """No usable OpenCL device, or a device spec that selects nothing."""

    exit_code = 3


class KernelBuildError(VggserveError):
    """An OpenCL program failed to build; the message carries the build log."""

    exit_code = 3


class WeightsError(VggserveError):
    """A weights file is unreadable, truncated, or has a missing key or a wrong shape."""

    exit_code = 4


class WeightsNotFound(WeightsError):
    """No weights were given and none were found in the default places."""


class CalibrationError(VggserveError):
    """8-bit (FP8, INT8) activation scales missing, damaged or made for other weights, or a `calibrate` run with
    nothing usable to calibrate on (a usage error: exit 2, as a bad setting)."""

    exit_code = 2


class ImageError(VggserveError):
    """An input is not a decodable image, or is outside the allowed formats or size."""

    exit_code = 5
    code = "invalid_image"
    http_status = 400


def describe(exc: BaseException) -> str:
    """One line for a user: the message of our own errors, `Type: first line of the message` for anything else."""
    if isinstance(exc, VggserveError):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
