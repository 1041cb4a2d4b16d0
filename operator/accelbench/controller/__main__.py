"""`python -m accelbench.controller`: run the operator with the metrics endpoint beside it.

Scope: --namespace (repeatable) or ENV_OPERATOR_NAMESPACES (comma-separated); none means
cluster-wide. Each flag's default comes from an ENV_OPERATOR_* variable (api.contract), which
the chart sets.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

import kopf

from ..api.contract import (
    ENV_OPERATOR_LIVENESS,
    ENV_OPERATOR_METRICS_PORT,
    ENV_OPERATOR_NAMESPACES,
    ENV_OPERATOR_PEERING,
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
        "--peering",
        default=os.environ.get(ENV_OPERATOR_PEERING) or None,
        help="peering name to run several replicas (needs the KopfPeering CRDs); standalone when unset",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    kopf.configure(verbose=args.verbose)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.peering:
        os.environ[ENV_OPERATOR_PEERING] = args.peering  # `configure` reads it at startup

    from .handlers import register
    from .metrics import METRICS

    register()

    if args.metrics_port:
        METRICS.serve(args.metrics_port)
    namespaces = args.namespace or _env_list(ENV_OPERATOR_NAMESPACES)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
