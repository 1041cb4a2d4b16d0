"""The SR3 super-resolution worker (issue 18 part 4) on CPU: the image quality measures against known
values, the dataset format, a tiny training that learns, and two torchrun processes (gloo) that
compute the one-process run's losses."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelbench.api.contract import ExitCode
from accelbench.workers import InvalidConfigError
from accelbench.workers.diffusion.images import degrade, load_images, make_sr_dataset
from accelbench.workers.diffusion.quality import psnr, ssim
from accelbench.workers.diffusion.sr3 import SRSettings, norm_groups, train
from accelbench.workers.jobenv import DistEnv

TINY = SRSettings(
    size=16,
    scale=2,
    channels=(16, 32),
    layers_per_block=1,
    batch=8,
    steps=40,
    learning_rate=2e-3,
    sample_steps=8,
    warmup_steps=1,
)


def test_psnr_and_ssim_of_identical_and_known_images() -> None:
    image = torch.rand(2, 3, 16, 16) * 2 - 1
    assert torch.isinf(psnr(image, image)).all()
    assert torch.allclose(ssim(image, image), torch.ones(2), atol=1e-5)
    # A uniform error of 0.1 on [0, 1] intensities: MSE 0.01, PSNR 20 dB (no pixel clipped: the
    # image stays below 0.6, so +0.2 stays inside [-1, 1]).
    low = torch.rand(2, 3, 16, 16) * 1.6 - 1
    assert psnr(low + 0.2, low) == pytest.approx(torch.full((2,), 20.0), abs=1e-3)
    noisy = (image + 0.3 * torch.randn_like(image)).clamp(-1, 1)
    assert (ssim(noisy, image) < ssim(image, image) - 0.05).all()


def test_ssim_of_a_constant_shift_stays_high_and_psnr_falls() -> None:
    flat = torch.zeros(1, 3, 16, 16)
    shifted = flat + 0.02  # 0.01 on [0, 1]: 40 dB
    assert float(psnr(shifted, flat)) == pytest.approx(40.0, abs=1e-3)
    assert float(ssim(shifted, flat)) > 0.99


def test_synthetic_dataset_is_png_files_loaded_in_range(tmp_path: Path) -> None:
    folder = make_sr_dataset(tmp_path / "images", n=5, size=24, seed=3)
    assert sorted(p.name for p in folder.iterdir()) == [f"img-0000{i}.png" for i in range(5)]
    images = load_images(folder, 16)  # resized on load
    assert images.shape == (5, 3, 16, 16)
    assert images.min() >= -1 and images.max() <= 1
    again = load_images(make_sr_dataset(tmp_path / "again", n=5, size=24, seed=3), 16)
    assert torch.equal(images, again)


def test_bad_datasets_and_settings_say_why(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidConfigError, match=r"no .* images"):
        load_images(tmp_path / "empty", 16)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.png").write_bytes(b"not a png")
    with pytest.raises(InvalidConfigError, match="cannot be read"):
        load_images(tmp_path / "broken", 16)
    with pytest.raises(InvalidConfigError, match="divide"):
        degrade(torch.zeros(1, 3, 15, 15), 2)
    with pytest.raises(InvalidConfigError, match="does not split"):
        SRSettings(batch=3).check(2)
    with pytest.raises(InvalidConfigError, match="size 20 must be divisible"):
        SRSettings(size=20, scale=4).check(1)
    assert norm_groups((16, 32)) == 16 and norm_groups((64, 128)) == 32


def test_tiny_sr3_training_learns_and_reports(tmp_path: Path) -> None:
    images = load_images(make_sr_dataset(tmp_path / "images", n=40, size=16, seed=0), 16)
    report = train(TINY, images[:32], images[32:], DistEnv(), log=lambda _: None)
    assert report.processes == 1 and report.steps == 40 and report.global_batch == 8
    assert len(report.losses) == 40
    first, last = sum(report.losses[:5]) / 5, sum(report.losses[-5:]) / 5
    assert last < 0.7 * first, report.losses
    assert report.images_per_second and report.images_per_second == report.images_per_second_per_chip
    assert report.eval_images == 8 and report.sample_steps == 8
    assert report.psnr is not None and math.isfinite(report.psnr)
    assert report.bicubic_psnr is not None and report.bicubic_psnr > 10  # the baseline is sane
    assert report.ssim is not None and -1 <= report.ssim <= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, name: str, launcher: list[str]) -> dict:
    out = tmp_path / f"{name}.json"
    args = "--synthetic 24 --eval-images 4 --size 16 --scale 2 --channels 16,32 --layers-per-block 1 "
    args += "--batch 8 --steps 3 --warmup-steps 1 --sample-steps 2 --precision fp32"
    args = ["--data", str(tmp_path / "shared"), *args.split(), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [*launcher, "-m", "accelbench.workers.diffusion", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_torchrun_processes_compute_the_one_process_losses(tmp_path: Path) -> None:
    one = _run(tmp_path, "one", [sys.executable])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    two = _run(tmp_path, "two", torchrun)
    assert two["processes"] == 2 and one["processes"] == 1
    # Step 1: the same weights and draws; steps 2-3 agree only if both halves' gradients were averaged.
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4)
    assert two["images_per_second_per_chip"] == pytest.approx(two["images_per_second"] / 2)


def test_the_cli_refuses_bad_settings_with_the_invalid_config_code(tmp_path: Path) -> None:
    make_sr_dataset(tmp_path / "d", n=4, size=16)
    bad = "--size 16 --scale 3 --eval-images 1"  # 3 does not divide 16
    result = subprocess.run(
        [sys.executable, "-m", "accelbench.workers.diffusion", "--data", str(tmp_path / "d"), *bad.split()],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert result.returncode == ExitCode.INVALID_CONFIG, result.stderr[-2000:]
    assert "invalid configuration" in result.stderr
