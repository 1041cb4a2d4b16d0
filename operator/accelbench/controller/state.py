"""What every handler shares: the API client, the metrics, and the catalog with the cluster's price
and image overrides (read from a ConfigMap at most once a minute)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from urllib3.exceptions import HTTPError

from ..api.contract import (
    ENV_OPERATOR_API_BURST,
    ENV_OPERATOR_API_QPS,
    ENV_OPERATOR_CLUSTER_NAME,
    ENV_OPERATOR_METRICS_NAMESPACES,
    ENV_OPERATOR_NETWORK_POLICIES,
    ENV_OPERATOR_PRICES_NAMESPACE,
    ENV_POD_NAMESPACE,
)
from ..catalog import load_catalog, parse_image_overrides, parse_price_overrides
from ..catalog.types import Catalog
from ..kubeapi import ApiError
from ..render import NetworkPolicies
from .kube import Kube
from .metrics import Metrics
from .ratelimit import TokenBucket
from .reconcile import ASK_WHY_BURST, ASK_WHY_QPS

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_OPERATOR_NAMESPACE = "accelbench-system"
DEFAULT_PRICES_CONFIGMAP = "accelbench-prices"


def operator_namespace() -> str:
    """Where the price ConfigMap lives: env, else the pod's own namespace, else the default."""
    explicit = os.environ.get(ENV_OPERATOR_PRICES_NAMESPACE) or os.environ.get(ENV_POD_NAMESPACE)
    if explicit:
        return explicit
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or DEFAULT_OPERATOR_NAMESPACE
    except OSError:
        return DEFAULT_OPERATOR_NAMESPACE


# The operator's client rate (client-go's controllers default to 20/30, Kueue ships 50/100, KubeRay
# 100/200). A new run costs ~9 writes (benchmarks/scale: 7 POSTs, 2 status PATCHes): at 50/s, 100
# new runs waited 13 s for their Jobs, all of it in this limit; 100/s halves that.
DEFAULT_API_QPS = 300.0  # the chart's apiQPS/apiBurst defaults (values.yaml says why)
DEFAULT_API_BURST = 300


def api_limiter(env: dict[str, str] | None = None) -> TokenBucket:
    """The token bucket every request of the operator takes from (chart: apiQPS, apiBurst)."""
    env = dict(os.environ) if env is None else env
    qps_text = env.get(ENV_OPERATOR_API_QPS) or str(DEFAULT_API_QPS)
    burst_text = env.get(ENV_OPERATOR_API_BURST) or str(DEFAULT_API_BURST)
    try:
        return TokenBucket(float(qps_text), int(burst_text))
    except ValueError as exc:
        raise ValueError(
            f"{ENV_OPERATOR_API_QPS}={qps_text!r} / {ENV_OPERATOR_API_BURST}={burst_text!r}: {exc}"
        ) from exc


def network_policies(env: dict[str, str] | None = None) -> NetworkPolicies | None:
    """The chart's networkPolicy values, or None (no policies) when it turned them off."""
    env = dict(os.environ) if env is None else env
    if env.get(ENV_OPERATOR_NETWORK_POLICIES, "").lower() != "true":
        return None
    own = env.get(ENV_POD_NAMESPACE) or operator_namespace()
    scrapers = tuple(n.strip() for n in env.get(ENV_OPERATOR_METRICS_NAMESPACES, "").split(",") if n.strip())
    return NetworkPolicies(operator_namespace=own, metrics_namespaces=scrapers)


ASKED_WHY_KEPT = 1024


@dataclass(frozen=True)
class AskedWhy:
    """The last read of a pod-less Job's Events (reconcile.ask_why_again_after)."""

    when: datetime
    refused: str | None  # the refusal they said, None when none
    asks: int  # reads so far: the interval to the next one doubles with each


def ask_why_budget() -> TokenBucket:
    return TokenBucket(ASK_WHY_QPS, ASK_WHY_BURST)


@dataclass
class ControllerState:
    """Shared by every handler through kopf's memo (each object's memo is a shallow copy of this one)."""

    kube: Kube
    metrics: Metrics
    price_namespace: str
    price_config_map: str
    catalog_ttl_s: float = 60.0
    network: NetworkPolicies | None = None  # each run's NetworkPolicies (render/network.py)
    cluster: str | None = field(default_factory=lambda: os.environ.get(ENV_OPERATOR_CLUSTER_NAME) or None)
    # Job uid -> its last ask; every ask takes a token of the budget (reconcile.ASK_WHY_QPS).
    asked_why: dict[str, AskedWhy] = field(default_factory=dict, repr=False)
    ask_why_budget: TokenBucket = field(default_factory=ask_why_budget, repr=False)
    _catalog: Catalog | None = field(default=None, repr=False)
    _loaded_at: float = field(default=float("-inf"), repr=False)

    def remember_asked_why(self, job_uid: str, now: datetime, refused: str | None) -> None:
        before = self.asked_why.get(job_uid)
        self.asked_why[job_uid] = AskedWhy(now, refused, (before.asks if before else 0) + 1)
        if len(self.asked_why) > ASKED_WHY_KEPT:  # Jobs long gone or long started: forget them
            old = now - timedelta(minutes=10)
            for uid in [u for u, asked in self.asked_why.items() if asked.when < old]:
                self.asked_why.pop(uid, None)

    def catalog(self) -> Catalog:
        """The catalog with ConfigMap price overrides, re-read at most once a minute."""
        if self._catalog is None or time.monotonic() - self._loaded_at > self.catalog_ttl_s:
            self._catalog = self._load_catalog()
            self._loaded_at = time.monotonic()
        return self._catalog

    def _load_catalog(self) -> Catalog:
        log = logging.getLogger(__name__)
        try:
            data = self.kube.read_config_map_data(self.price_namespace, self.price_config_map)
        except (ApiError, HTTPError, OSError) as exc:
            # No RBAC or no apiserver for it: catalog prices are still correct, just not overridden.
            log.warning(
                "price ConfigMap %s/%s unreadable: %s", self.price_namespace, self.price_config_map, exc
            )
            data = None
        overrides, images = None, None
        if data:
            try:
                overrides = parse_price_overrides(data)
            except ValueError as exc:
                log.warning("ignoring the prices in ConfigMap %s: %s", self.price_config_map, exc)
            try:
                images = parse_image_overrides(data)
            except ValueError as exc:
                log.warning("ignoring the images in ConfigMap %s: %s", self.price_config_map, exc)
        try:
            return load_catalog(price_overrides=overrides, image_overrides=images)
        except ValueError as exc:  # an unknown accelerator name: keep the built-in catalog
            log.warning("ignoring ConfigMap %s: %s", self.price_config_map, exc)
            return load_catalog()
