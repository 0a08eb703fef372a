"""X-Vggserve-Frontend: the pid of the HTTP front-end process that answered, on every response of a front end
(`--http-workers N`; for debugging how the load spreads)."""

HEADER = "X-Vggserve-Frontend"


class FrontendHeaderMiddleware:
    """Pure ASGI middleware: names the answering process on every response."""

    def __init__(self, app, value: str):
        self.app = app
        self.header = (HEADER.lower().encode(), value.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, send_named)
