"""benchmarks/finetune/child.py's step profile: GPU kernels sorted into where a step's time goes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _child() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks/finetune/child.py"
    spec = importlib.util.spec_from_file_location("finetune_bench_child", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("kernel", "category"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NNT", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "matmul"),
        ("aten::addmm", "matmul"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "loss"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("Memcpy DtoD (Device -> Device)", "copy / cast"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "fused by torch.compile"),  # first match wins
        ("triton_tem_fused_mm_1", "fused by torch.compile"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            "other elementwise / norm",
        ),
    ],
)
def test_kernels_are_sorted_by_what_they_do(kernel: str, category: str) -> None:
    assert _child().kernel_category(kernel) == category


def test_breakdown_adds_up_to_the_step_with_idle_time_for_the_rest() -> None:
    kernels = [("sm90_xmma_gemm_a", 0.6, 400), ("flash_fwd_kernel", 0.1, 62), ("elementwise_add", 0.05, 900)]
    out = _child().profile_breakdown(kernels, 1.0)
    assert out["gpu_busy_seconds"] == pytest.approx(0.75) and out["gpu_idle_seconds"] == pytest.approx(0.25)
    assert list(out["categories"]) == ["matmul", "attention", "other elementwise / norm"]  # largest first
    assert out["categories"]["matmul"] == {"seconds": 0.6, "kernels": 400}
    assert sum(out["share_of_step"].values()) == pytest.approx(1.0)
    assert out["share_of_step"]["idle"] == pytest.approx(0.25)
    # kernels on overlapping streams can add up past the wall time: idle is then 0, never negative
    assert _child().profile_breakdown(kernels, 0.5)["gpu_idle_seconds"] == 0.0


def test_the_profilers_step_marker_is_the_steps_span_not_gpu_work() -> None:
    """ProfilerStep* spans the step's kernels on the GPU timeline: counted as work, it doubled the
    busy time and hid the idle time (the first H100 profiles). It is the step's span instead of the
    host's wall time, which also holds the profiler's trace collection."""
    kernels = [("ProfilerStep*", 0.8, 1), ("nvjet_sm90_tst_192x192", 0.6, 400), ("elementwise_add", 0.1, 90)]
    out = _child().profile_breakdown(kernels, 1.5)
    assert out["step_seconds"] == 0.8 and out["step_span"] == "profiler step range on the GPU"
    assert out["gpu_busy_seconds"] == pytest.approx(0.7) and out["gpu_idle_seconds"] == pytest.approx(0.1)
    assert out["categories"]["other elementwise / norm"] == {"seconds": 0.1, "kernels": 90}
    assert sum(out["share_of_step"].values()) == pytest.approx(1.0)
    assert not _child().is_kernel("gemm_of_a_named_range", user_annotation=True)
