"""CORS (`--cors-origin`): Starlette's middleware, with a refused preflight answered in the project's JSON error
shape (it carries X-Request-ID too, the request-id middleware being outside this one) instead of its text/plain."""

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

from ..protocols.errors import error_response


class JsonCORSMiddleware(CORSMiddleware):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                response = self.preflight_response(request_headers=headers)
                if response.status_code == 400:
                    response = self._refusal(response, headers, scope.get("path", ""))
                return await response(scope, receive, send)
        await super().__call__(scope, receive, send)

    def _refusal(self, refused, request_headers: Headers, path: str):
        """Starlette's refusal (text "Disallowed CORS origin, method") as our error, one reason per failure."""
        reasons = {
            "origin": f"origin {request_headers['origin']!r} is not allowed (the server's operator allows origins "
                      "with --cors-origin)",
            "method": f"method {request_headers['access-control-request-method']!r} is not allowed (only "
                      f"{', '.join(sorted(self.allow_methods))})",
            "headers": "the requested headers are not allowed",
            "private-network": "private-network access is not allowed"}
        failures = refused.body.decode().removeprefix("Disallowed CORS ").split(", ")
        message = "CORS preflight refused: " + "; ".join(reasons.get(f, f) for f in failures)
        kept = {k: v for k, v in refused.headers.items() if k not in ("content-type", "content-length")}
        return error_response(400, "cors_refused", message, kept, path)
