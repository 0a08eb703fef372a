"""Optional API key: with one configured, every endpoint but the health checks needs `Authorization: Bearer <key>`."""

import hmac

from ..protocols.errors import error_response

OPEN_PATHS = frozenset({"/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready"})


class ApiKeyMiddleware:
    """Pure ASGI middleware answering 401 before the app sees an unauthenticated request."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    def _authorised(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                return hmac.compare_digest(value.strip(), self.expected)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS or self._authorised(scope):
            return await self.app(scope, receive, send)
        await error_response(401, "unauthorized", "this server needs an API key: send the header "
                             "`Authorization: Bearer <key>`", {"WWW-Authenticate": 'Bearer realm="vggserve"'},
                             scope.get("path", ""))(
            scope, receive, send)
