"""accelbench.io/v1alpha1: pydantic models are the single schema source for CRDs and reports.

- the resources and their status (finetune, inference, common, status, resources);
- what crosses into and out of a pod: the JobPayload (payload) and the WorkerReport (report);
- contract: every other name the operator, pods, Prometheus and the chart share;
- errors: validation errors as lines a user can act on.

This package imports nothing else of the project.
"""

from .base import API_VERSION, GROUP, VERSION, ApiModel
from .common import Accelerator, AcceleratorType, Capacity, ModelFamily, ModelSource, PriceSource, Pricing
from .finetune import FinetuneJobSpec, Framework, LossOn, MethodType, Task
from .inference import Engine, InferenceBenchSpec
from .report import ReportError, WorkerReport, parse_termination_message
from .resources import KINDS, FinetuneJob, InferenceBench, Resource, parse_resource
from .status import Condition, Phase, Reason

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "Accelerator",
    "AcceleratorType",
    "ApiModel",
    "Capacity",
    "Condition",
    "Engine",
    "FinetuneJob",
    "FinetuneJobSpec",
    "Framework",
    "InferenceBench",
    "InferenceBenchSpec",
    "LossOn",
    "MethodType",
    "ModelFamily",
    "ModelSource",
    "Phase",
    "PriceSource",
    "Pricing",
    "Reason",
    "ReportError",
    "Resource",
    "Task",
    "WorkerReport",
    "parse_resource",
    "parse_termination_message",
]
