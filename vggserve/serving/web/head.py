"""HEAD on every GET endpoint (/health/*, /metadata, /metrics, /docs, /openapi.json, the v2 GETs): answered as GET
without the body, as load balancers and uptime probes expect. HEAD elsewhere keeps its 404 or 405."""

from starlette.routing import Match


class HeadAsGetMiddleware:
    """Pure ASGI middleware, innermost: a HEAD request for a path some GET route takes is routed as that GET, and its
    answer is sent with its headers (Content-Length included) and an empty body."""

    def __init__(self, app, router):
        self.app = app
        self.router = router

    def _get_route_takes(self, scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in self.router.routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)
        as_get = {**scope, "method": "GET"}
        if not self._get_route_takes(as_get):
            return await self.app(scope, receive, send)

        async def without_body(message):
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {**message, "body": b""}
            await send(message)

        await self.app(as_get, receive, without_body)
