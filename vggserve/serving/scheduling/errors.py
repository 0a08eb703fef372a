"""The scheduler's own errors: why one image was not computed. They carry a stable `code` and a message that names
the cause and the fix, and nothing about HTTP: each protocol (`protocols.classify`, `protocols.v2`) maps the class
to its own status and error shape. They pickle whole, so they cross the engine link and process pools unchanged."""

from ...wording import count


class SchedulingError(Exception):
    """Base class. `retry_after_s`: when the client may retry (None: retrying the same request will not help)."""

    code = "scheduling_error"
    retry_after_s: int | None = None

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __reduce__(self):  # rebuilt from its state, whatever the subclass's constructor takes
        return _rebuild, (type(self), self.message, self.code)


def _rebuild(cls, message: str, code: str) -> SchedulingError:
    error = cls.__new__(cls)
    SchedulingError.__init__(error, message, code)
    return error


class QueueFull(SchedulingError):
    code = "queue_full"
    retry_after_s = 1

    def __init__(self, capacity: int):
        """`capacity`: the room that is taken, --max-queue (with HTTP front ends, every front end's images count)."""
        super().__init__(f"the server's queue is full ({count(capacity, 'image')} waiting or being decoded, "
                         f"--max-queue {capacity}); retry after {self.retry_after_s} s")


class DeadlineExceeded(SchedulingError):
    code = "deadline_exceeded"

    def __init__(self, waited_s: float):
        super().__init__(f"the request's deadline passed while it waited {waited_s * 1000:.0f} ms for a device; it "
                         "was not computed (allow more time, or retry when the server is less busy)")


class ClientGone(SchedulingError):
    code = "client_closed_request"

    def __init__(self):
        super().__init__("the client closed the connection; the image was not computed")


class Unavailable(SchedulingError):
    """The service cannot take images now: `code` is not_ready, draining, shutting_down, no_workers or unavailable."""

    retry_after_s = 1

    def __init__(self, code: str, message: str):
        super().__init__(message, code)


def shutting_down(message: str = "the server is shutting down") -> Unavailable:
    return Unavailable("shutting_down", message)


class InferenceFailed(SchedulingError):
    code = "inference_failed"

    def __init__(self, device: str, exc: BaseException):
        super().__init__(f"inference failed on device {device}: {exc}")


class PreprocessFailed(SchedulingError):
    code = "preprocess_failed"


class InternalError(SchedulingError):
    code = "internal_error"
