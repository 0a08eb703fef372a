"""HTTP plumbing shared by every protocol: pure ASGI middlewares (API key, body limit, drain, request ids, CORS) and
the self-hosted API docs."""
