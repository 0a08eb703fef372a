"""The HTTP service: FastAPI + uvicorn, dynamic batching per device worker, Prometheus metrics, graceful drain.

    from vggserve.serving import Settings, create_app
"""

from .app import create_app
from .settings import Settings, SettingsError

__all__ = ["create_app", "Settings", "SettingsError"]
