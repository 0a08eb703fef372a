"""HTTP plumbing shared by every protocol: the HTTP connection under uvicorn (deadline on the headers, JSON for what
the parser refuses), pure ASGI middlewares (API key, the body's size and pace, drain, request ids, CORS, HEAD as GET)
and the self-hosted API docs."""
