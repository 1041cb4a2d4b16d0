"""validate_against_catalog: every reason a spec cannot run as written, without raising."""

from __future__ import annotations

from ..api.finetune import FinetuneJobSpec
from ..api.inference import Engine, InferenceBenchSpec
from ..catalog import Catalog
from .finetune import plan_finetune
from .inference import plan_inference
from .types import PlanError


def validate_against_catalog(spec: FinetuneJobSpec | InferenceBenchSpec, catalog: Catalog) -> list[str]:
    """Problems a user can act on (empty when the spec plans and every image is known).

    The API's own validation has already passed; this checks what only the catalog knows:
    the accelerator's shapes and memory, and that an image exists for what will run.
    """
    problems: list[str] = []
    try:
        if isinstance(spec, FinetuneJobSpec):
            plan = plan_finetune(spec, catalog)
        else:
            plan = plan_inference(spec, catalog)
    except PlanError as exc:
        return [str(exc)]
    accel = catalog.get(plan.accelerator)
    if isinstance(spec, FinetuneJobSpec):
        framework = spec.framework.value if spec.framework else accel.default_framework
        if spec.image is None and getattr(accel.images, framework) is None:
            problems.append(f"the catalog has no {framework} worker image for {accel.name}; set spec.image")
        return problems
    engine = spec.server.engine
    if (
        engine != Engine.EXTERNAL
        and spec.server.image is None
        and getattr(accel.images, engine.value) is None
    ):
        problems.append(f"the catalog has no {engine.value} image for {accel.name}; set spec.server.image")
    if spec.client_image is None and accel.images.bench is None:
        problems.append(f"the catalog has no load-generator image for {accel.name}; set spec.clientImage")
    return problems
