"""Response bodies, as pydantic models so /docs shows them. Routes build plain dicts of the same shape."""

from pydantic import BaseModel, Field

from .errors import ErrorDetail


class Prediction(BaseModel):
    index: int = Field(description="ImageNet-1k class index, 0..999.")
    label: str = Field(description="Class name.")
    probability: float = Field(description="Softmax probability, 0..1.")


class Timing(BaseModel):
    queue: float = Field(description="Milliseconds from entering the device queue to the start of its batch.")
    preprocess: float = Field(description="Milliseconds decoding and preprocessing the image.")
    inference: float = Field(description="Milliseconds of device time for the batch the image ran in.")
    total: float = Field(description="Milliseconds the server spent on the request.")


class ClassifyResponse(BaseModel):
    request_id: str = Field(description="The request's `X-Request-ID` as the client sent it, or a generated one; "
                            "also in the `X-Request-ID` header of every answer.")
    model: str = Field(description="Model name, `vgg16`.")
    predictions: list[Prediction] = Field(description="The `top_k` most probable classes, highest first.")
    timing_ms: Timing


class BatchItem(BaseModel):
    filename: str | None = Field(description="The file's name in the multipart request, if it had one.")
    predictions: list[Prediction] | None = Field(None, description="Present when this file was classified.")
    timing_ms: Timing | None = None
    error: ErrorDetail | None = Field(None, description="Present instead of predictions when this file failed.")


class BatchResponse(BaseModel):
    request_id: str
    model: str
    results: list[BatchItem] = Field(description="One entry per file, in the order the files were sent.")


class Health(BaseModel):
    status: str = Field(description="`ok`/`ready`, or why not, e.g. `not_ready`, `draining`, `worker_failed`.")
    detail: str = Field(description="Human-readable detail.")


class WeightsInfo(BaseModel):
    path: str | None
    format: str | None
    sha256: str | None


class DeviceInfo(BaseModel):
    spec: str = Field(description="Device spec the worker was started with, e.g. `gpu:0`.")
    label: str = Field(description="The worker's name in the metrics and the log: its spec, or `gpu#1`, `gpu#2` "
                                   "for a spec given more than once.")
    state: str = Field(description="starting, loading, warming, ready, stopped or failed.")
    error: str | None
    batches: int = Field(description="Batches computed so far.")
    name: str | None = Field(description="OpenCL device name once loaded.")
    memory: dict | None = Field(None, description="What OpenCL tells about the device once loaded: "
                                "`global_memory_bytes`, `compute_units`, and `engine_bytes`, the OpenCL buffers the "
                                "engine holds there.")


class FrontendInfo(BaseModel):
    index: int = Field(description="Which front-end process, 0 .. http_workers - 1 (kept across restarts).")
    pid: int = Field(description="Its process id; also sent on every response as `X-Vggserve-Frontend`.")


class Metadata(BaseModel):
    model: str
    version: str
    weights: WeightsInfo
    preprocessing: str | None = Field(description="`torchvision` or `caffe` input normalisation.")
    precision: str = Field("fp32", description="The engine's precision: `fp32`, `tf32` or `fp16`.")
    input: dict = Field(description="Model input shape and dtype.")
    labels: int = Field(description="Number of classes.")
    devices: list[DeviceInfo]
    max_batch_size: int
    max_wait_ms: float
    max_queue: int
    request_timeout_ms: int
    max_body_bytes: int
    max_pixels: int
    max_files: int
    preprocess_threads: int = Field(description="Threads decoding (or, with processes, normalising) images.")
    preprocess_procs: int = Field(description="Worker processes decoding images; 0 when the threads do it.")
    mpi: bool
    http_workers: int = Field(1, description="HTTP front-end processes feeding the device workers.")
    engine_processes: int = Field(1, description="Engine processes behind the front ends: one per device with "
                                  "--engine-processes per-device, else 1.")
    resize_on_device: bool = Field(False, description="Whether uploads are decoded by the front ends and resized and "
                                   "centre-cropped on the device (bit for bit as on the CPU), with --http-workers "
                                   "above 1 and the OpenCL engine.")
    decode: str = Field("exact", description="--decode: exact, fast, gpu or auto.")
    decode_group: int = Field(4, description="--decode-group: batches whose JPEGs one device decode takes at most "
                              "(with --decode gpu or auto, when that many full batches are waiting).")
    lanes: int = Field(1, description="--lanes: forward passes each device's engine may run at once, each on a queue "
                       "of its own.")
    decodes_on_device: bool = Field(False, description="Whether JPEGs the device decoder takes are sent to the engine "
                                    "compressed and decoded on its device (--decode gpu, or auto on a GPU).")
    frontend: FrontendInfo | None = Field(None, description="The front-end process that answered (with "
                                          "--http-workers above 1).")
