"""The HTTP toolkit the three servers share (the chat server, the router, the bootstrap service):
the deployment secret, typed errors and their JSON bodies, body and keep-alive limits, Prometheus
metrics, and the token-gated debug routes. Below ``serving``, ``router`` and ``disagg``; above
``core`` (an error names a request's ``Failure``). ``engine.http.timeouts`` (the request-head
deadline, and ``run_server``, with which every server CLI starts uvicorn) is imported on its own, so
that importing this package does not import uvicorn."""

from engine.http.auth import SECRET_ENV, SECRET_HEADER, presents_secret
from engine.http.debug import add_debug_routes, check_access
from engine.http.errors import (
    BadRequestError,
    ErrorResponse,
    UnauthorizedError,
    error_response,
    json_object,
)
from engine.http.limits import CLIENT_KEEPALIVE_EXPIRY_S, SERVER_KEEP_ALIVE_S, BodyLimit
from engine.http.metrics import Metrics

__all__ = ["CLIENT_KEEPALIVE_EXPIRY_S", "SECRET_ENV", "SECRET_HEADER", "SERVER_KEEP_ALIVE_S",
           "BadRequestError", "BodyLimit", "ErrorResponse", "Metrics", "UnauthorizedError",
           "add_debug_routes", "check_access", "error_response", "json_object", "presents_secret"]
