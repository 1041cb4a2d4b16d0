"""SR3-style conditional diffusion super-resolution on diffusers' UNet2DModel.

The network sees the noisy high-resolution image and the low-resolution one (bicubic back to full
size, `images.degrade`) stacked on channels (6 in, 3 out) and predicts the noise: the DDPM epsilon
objective with linear betas over 1,000 training timesteps, as SR3 trained. Evaluation samples with
DDIM in `sample_steps` steps from pure noise, conditioned on held-out images' low-resolution views,
and scores PSNR and SSIM against the originals beside the bicubic baseline, so a report says
whether the model beats plain interpolation.

Data parallel over torchrun's processes (DDP): every rank draws the global batch's image indices,
timesteps and noise from one generator seeded alike and trains on its slice, so N processes compute
the gradient of the same global batch as one process does (tests check the loss).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import InvalidConfigError
from ..finetune.torch_worker import peak_memory, pick_device, synchronize
from ..jobenv import DistEnv
from .images import degrade
from .quality import psnr, ssim

PRECISIONS = ("bf16", "fp32")


@dataclass(frozen=True)
class SRSettings:
    size: int = 64  # high-resolution side, pixels
    scale: int = 4  # the low-resolution input is size / scale
    channels: tuple[int, ...] = (64, 128, 256, 256)  # UNet width per resolution level
    layers_per_block: int = 2
    attention_levels: int = 1  # how many of the lowest-resolution levels have self-attention
    batch: int = 16  # global: images per optimizer step over all processes
    steps: int = 100
    learning_rate: float = 1e-4
    precision: str = "bf16"  # autocast on accelerators; the CPU trains in fp32
    train_timesteps: int = 1000
    sample_steps: int = 50  # DDIM steps per held-out image at evaluation
    warmup_steps: int = 2  # leading steps left out of images/s (allocator, cuDNN autotune)
    seed: int = 0

    def check(self, processes: int) -> None:
        """InvalidConfigError for settings that cannot run, naming the field."""
        if self.precision not in PRECISIONS:
            raise InvalidConfigError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if self.batch % processes:
            raise InvalidConfigError(f"batch {self.batch} does not split over {processes} processes")
        if self.size % (self.scale * 2 ** (len(self.channels) - 1)):
            raise InvalidConfigError(
                f"size {self.size} must be divisible by scale {self.scale} and by 2^{len(self.channels) - 1} "
                f"(the UNet halves it {len(self.channels) - 1} times)"
            )
        if not 0 <= self.attention_levels <= len(self.channels):
            raise InvalidConfigError(
                f"attentionLevels {self.attention_levels} exceeds {len(self.channels)} levels"
            )
        if self.warmup_steps >= self.steps:
            raise InvalidConfigError(f"steps {self.steps} must exceed the {self.warmup_steps} warm-up steps")


@dataclass
class SRReport:
    device: str
    processes: int
    steps: int
    global_batch: int
    parameters: int
    images_per_second: float | None  # global batch / median worker-timed step after the warm-up
    images_per_second_per_chip: float | None
    step_seconds_median: float | None
    setup_seconds: float
    first_step_seconds: float
    losses: list[float] = field(default_factory=list)  # global mean per step
    eval_images: int = 0
    sample_steps: int = 0
    psnr: float | None = None  # mean over held-out images, dB
    ssim: float | None = None
    bicubic_psnr: float | None = None
    bicubic_ssim: float | None = None
    eval_seconds: float | None = None
    peak_memory_bytes: int | None = None
    train_seconds: float | None = None  # all training steps, warm-up included


def norm_groups(channels: tuple[int, ...]) -> int:
    """GroupNorm groups dividing every level's width: 32 as diffusers' default where it can."""
    groups = 32
    while groups > 1 and any(c % groups for c in channels):
        groups //= 2
    return groups


def build_unet(settings: SRSettings) -> torch.nn.Module:
    from diffusers import UNet2DModel

    levels = len(settings.channels)
    first_attention = levels - settings.attention_levels
    down = tuple("AttnDownBlock2D" if i >= first_attention else "DownBlock2D" for i in range(levels))
    up = tuple("AttnUpBlock2D" if i < settings.attention_levels else "UpBlock2D" for i in range(levels))
    return UNet2DModel(
        sample_size=settings.size,
        in_channels=6,
        out_channels=3,
        layers_per_block=settings.layers_per_block,
        block_out_channels=settings.channels,
        down_block_types=down,
        up_block_types=up,
        norm_num_groups=norm_groups(settings.channels),
    )


def _init_process_group(dist: DistEnv, device: torch.device) -> bool:
    if not dist.distributed:
        return False
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return True


def _autocast(device: torch.device, precision: str) -> torch.autocast:
    enabled = precision == "bf16" and device.type != "cpu"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def train(
    settings: SRSettings,
    train_images: torch.Tensor,
    eval_images: torch.Tensor,
    dist: DistEnv,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, int, float], None] | None = None,
    save_to: Path | None = None,
) -> SRReport:
    """Train on `train_images` (N, 3, size, size in [-1, 1]) and evaluate on `eval_images`.

    `on_step(step, steps, loss)` after every step (progress, gauges); `save_to`: the main process
    writes the trained UNet there (diffusers' save_pretrained: config.json and safetensors)."""
    from diffusers import DDIMScheduler, DDPMScheduler

    started = time.perf_counter()
    settings.check(dist.world_size)
    if train_images.shape[-1] != settings.size:
        raise InvalidConfigError(f"images are {train_images.shape[-1]} px, settings say size {settings.size}")
    info = pick_device(dist.local_rank)
    device = info.device
    distributed = _init_process_group(dist, device)
    torch.manual_seed(settings.seed)  # the same initial weights on every rank
    model = build_unet(settings).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    trained: torch.nn.Module = model
    if distributed:
        trained = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    scheduler = DDPMScheduler(num_train_timesteps=settings.train_timesteps, beta_schedule="linear")
    high = train_images.to(device)
    low = degrade(high, settings.scale)
    per_rank = settings.batch // dist.world_size
    mine = slice(dist.rank * per_rank, (dist.rank + 1) * per_rank)
    generator = torch.Generator().manual_seed(settings.seed + 1)
    setup_seconds = time.perf_counter() - started
    log(
        f"SR3 UNet {parameters / 1e6:.1f}M parameters on {info.name}, {dist.world_size} process(es), "
        f"{len(train_images)} images {settings.size}px (x{settings.scale}), batch {settings.batch}"
    )

    losses: list[float] = []
    seconds: list[float] = []
    model.train()
    for step in range(1, settings.steps + 1):
        # The global batch's draws, identical on every rank; each rank keeps its slice.
        index = torch.randint(0, len(high), (settings.batch,), generator=generator)[mine].to(device)
        timesteps = torch.randint(0, settings.train_timesteps, (settings.batch,), generator=generator)
        noise = torch.randn(settings.batch, 3, settings.size, settings.size, generator=generator)
        timesteps, noise = timesteps[mine].to(device), noise[mine].to(device)
        synchronize(device)
        tick = time.perf_counter()
        noisy = scheduler.add_noise(high[index], noise, timesteps)
        with _autocast(device, settings.precision):
            predicted = trained(torch.cat([noisy, low[index]], dim=1), timesteps).sample
        loss = F.mse_loss(predicted.float(), noise)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        global_loss = loss.detach()
        if distributed:
            torch.distributed.all_reduce(global_loss)
            global_loss /= dist.world_size
        losses.append(float(global_loss))
        synchronize(device)
        seconds.append(time.perf_counter() - tick)
        if on_step is not None:
            on_step(step, settings.steps, losses[-1])
        if dist.is_main and (step == 1 or step % max(1, settings.steps // 10) == 0 or step == settings.steps):
            log(f"step {step}/{settings.steps} loss {losses[-1]:.5f} ({seconds[-1]:.3f}s)")

    steady = seconds[settings.warmup_steps :]
    median = statistics.median(steady) if steady else None
    rate = settings.batch / median if median else None
    report = SRReport(
        device=info.name,
        processes=dist.world_size,
        steps=settings.steps,
        global_batch=settings.batch,
        parameters=parameters,
        images_per_second=rate,
        images_per_second_per_chip=rate / dist.world_size if rate else None,
        step_seconds_median=median,
        setup_seconds=round(setup_seconds, 3),
        first_step_seconds=round(seconds[0], 3),
        losses=losses,
    )
    if dist.is_main and len(eval_images):
        evaluate(model, settings, eval_images.to(device), device, report, DDIMScheduler)
        log(
            f"held-out {report.eval_images} images: PSNR {report.psnr:.2f} dB, SSIM {report.ssim:.4f} "
            f"(bicubic {report.bicubic_psnr:.2f} dB, {report.bicubic_ssim:.4f}) in {report.eval_seconds:.1f}s"
        )
    report.peak_memory_bytes = peak_memory(device)
    report.train_seconds = round(sum(seconds), 3)
    if dist.is_main and save_to is not None:
        model.save_pretrained(save_to, safe_serialization=True)  # type: ignore[operator]
    if distributed:
        torch.distributed.barrier()
    return report


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    settings: SRSettings,
    high: torch.Tensor,
    device: torch.device,
    report: SRReport,
    ddim_class: type,
) -> None:
    """DDIM sampling of every held-out image from its low-resolution view; PSNR/SSIM into `report`."""
    tick = time.perf_counter()
    model.eval()
    sampler = ddim_class(
        num_train_timesteps=settings.train_timesteps, beta_schedule="linear", clip_sample=True
    )
    sampler.set_timesteps(settings.sample_steps)
    low = degrade(high, settings.scale)
    generator = torch.Generator().manual_seed(settings.seed + 2)
    sample = torch.randn(high.shape, generator=generator).to(device)
    for timestep in sampler.timesteps:
        with _autocast(device, settings.precision):
            predicted = model(torch.cat([sample, low], dim=1), timestep.to(device)).sample
        sample = sampler.step(predicted.float(), timestep, sample).prev_sample
    synchronize(device)
    report.eval_images = len(high)
    report.sample_steps = settings.sample_steps
    report.psnr = float(psnr(sample, high).mean())
    report.ssim = float(ssim(sample, high).mean())
    report.bicubic_psnr = float(psnr(low, high).mean())
    report.bicubic_ssim = float(ssim(low, high).mean())
    report.eval_seconds = round(time.perf_counter() - tick, 3)
    model.train()
