"""The operator's own Kubernetes transport: where the apiserver is and who we are (config), and
requests with JSON bodies (http). The official client's generated API and models (30 MB, imported
whole) are not needed to send plain dicts, so the operator, the CLI and the workers do without it."""

from .config import ConfigError, Connection, current_context, load_connection
from .http import ApiError, KubeHTTP, Response

__all__ = [
    "ApiError",
    "ConfigError",
    "Connection",
    "KubeHTTP",
    "Response",
    "current_context",
    "load_connection",
]
