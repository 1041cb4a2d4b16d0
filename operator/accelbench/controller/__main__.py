"""`python -m accelbench.controller`: run the operator with the metrics endpoint beside it.

Scope: --namespace (repeatable) or ENV_OPERATOR_NAMESPACES (comma-separated); none means
cluster-wide. Each flag's default comes from an ENV_OPERATOR_* variable (api.contract), which
the chart sets.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import kopf

from ..api.contract import (
    ENV_OPERATOR_LEADER_ELECTION,
    ENV_OPERATOR_LIVENESS,
    ENV_OPERATOR_METRICS_PORT,
    ENV_OPERATOR_NAMESPACES,
    ENV_POD_NAME,
    EXIT_LOST_LEASE,
)


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m accelbench.controller", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=None, help="watch only this namespace")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get(ENV_OPERATOR_METRICS_PORT, "8080")),
        help="Prometheus metrics port; 0 disables it",
    )
    parser.add_argument(
        "--liveness",
        default=os.environ.get(ENV_OPERATOR_LIVENESS) or None,
        help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    parser.add_argument(
        "--leader-election",
        default=os.environ.get(ENV_OPERATOR_LEADER_ELECTION) or None,
        metavar="LEASE",
        help="run as one of several replicas: act only while holding this Lease (in the operator's "
        "namespace); the others wait and take over within 17 s of the holder's death",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def _standby_health(liveness: str | None) -> Any:
    """While a standby waits for the Lease, answer the liveness probe kopf will answer once active
    (the probe would otherwise restart a healthy standby); stopped before kopf binds the port."""
    if not liveness:
        return None
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"standby\n")

        def log_message(self, *args: Any) -> None:
            pass

    url = urlsplit(liveness)
    server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Ok)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    kopf.configure(verbose=args.verbose)
    if not args.verbose:
        # kopf logs every event handler and indexer call at INFO: a line per watch event at scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    from .handlers import register
    from .metrics import METRICS

    register()

    if args.metrics_port:
        METRICS.serve(args.metrics_port)
    namespaces = args.namespace or _env_list(ENV_OPERATOR_NAMESPACES)
    elector = None
    if args.leader_election:
        from ..kubeapi import load_connection
        from .kube import Kube
        from .leader import LeaderElector
        from .state import operator_namespace

        identity = os.environ.get(ENV_POD_NAME) or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaderElector(Kube(load_connection()), operator_namespace(), args.leader_election, identity)
        health = _standby_health(args.liveness)
        elector.acquire()
        if health is not None:
            health.shutdown()
            health.server_close()
        elector.keep(on_lost=lambda: os._exit(EXIT_LOST_LEASE))
    try:
        kopf.run(
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
        )
    finally:
        if elector is not None:
            elector.release()


if __name__ == "__main__":
    main()
