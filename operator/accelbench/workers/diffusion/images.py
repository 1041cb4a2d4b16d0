"""Super-resolution images: a folder of PNG/JPEG files is the dataset format; tests make synthetic ones.

SR3 trains on high-resolution images only: the low-resolution input of each is made from it here
(`degrade`: bicubic down by `scale`, antialiased, then bicubic back up to the high-resolution size),
so a user's dataset is just a folder of pictures and both the training pairs and the held-out pairs
are made the same way.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import InvalidConfigError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def make_sr_dataset(directory: str | Path, n: int = 64, size: int = 32, seed: int = 0) -> Path:
    """Write `n` RGB PNGs of `size`² pixels: a smooth two-colour gradient with a few ellipses,
    rectangles and stripes on it, so there are both flat areas and edges to recover. Deterministic."""
    from PIL import Image, ImageDraw

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    for index in range(n):
        a, b = (np.array([rng.random() for _ in range(3)], dtype=np.float32) for _ in range(2))
        weight = np.add.outer(ramp, ramp) / 2 if rng.random() < 0.5 else np.tile(ramp, (size, 1))
        pixels = (a * (1 - weight[..., None]) + b * weight[..., None]) * 255
        image = Image.fromarray(pixels.astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(rng.randint(2, 5)):
            colour = tuple(rng.randrange(256) for _ in range(3))
            x0, y0 = rng.randrange(size), rng.randrange(size)
            x1, y1 = x0 + rng.randint(2, size // 2), y0 + rng.randint(2, size // 2)
            shape = rng.choice(("ellipse", "rectangle", "stripes"))
            if shape == "ellipse":
                draw.ellipse((x0, y0, x1, y1), fill=colour)
            elif shape == "rectangle":
                draw.rectangle((x0, y0, x1, y1), fill=colour)
            else:
                for x in range(x0, x1, 3):
                    draw.line((x, y0, x, y1), fill=colour)
        # Written aside and renamed: processes writing the same dataset at once never read half a file.
        final = directory / f"img-{index:05d}.png"
        partial = directory / f".{final.name}.{os.getpid()}.partial"
        image.save(partial, format="PNG")
        os.replace(partial, final)
    return directory


def image_files(directory: str | Path) -> list[Path]:
    root = Path(directory)
    if not root.is_dir():
        raise InvalidConfigError(f"image dataset {root} is not a directory")
    return sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file() and not p.name.startswith(".")
    )


def load_images(directory: str | Path, size: int, limit: int | None = None) -> torch.Tensor:
    """Every image under `directory` (sorted by path) as float32 (N, 3, size, size) in [-1, 1]:
    centre-cropped to a square, resized with bicubic filtering when it is not `size` already."""
    from PIL import Image

    files = image_files(directory)[:limit]
    if not files:
        raise InvalidConfigError(f"no {'/'.join(IMAGE_SUFFIXES)} images under {directory}")
    out = torch.empty(len(files), 3, size, size)
    for i, path in enumerate(files):
        try:
            with Image.open(path) as opened:
                image = opened.convert("RGB")
        except OSError as error:
            raise InvalidConfigError(f"image {path} cannot be read: {error}") from error
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        image = image.crop((left, top, left + side, top + side))
        if side != size:
            image = image.resize((size, size), Image.Resampling.BICUBIC)
        array = np.asarray(image, dtype=np.float32) / 127.5 - 1.0
        out[i] = torch.from_numpy(array).permute(2, 0, 1)
    return out


def degrade(high: torch.Tensor, scale: int) -> torch.Tensor:
    """The low-resolution view of `high` (N, C, H, W), brought back to H × W: what SR3 conditions on,
    and the bicubic baseline the model must beat."""
    if scale < 2 or high.shape[-1] % scale or high.shape[-2] % scale:
        raise InvalidConfigError(
            f"scale {scale} must be >= 2 and divide the image size {tuple(high.shape[-2:])}"
        )
    size = high.shape[-2:]
    low = F.interpolate(high, scale_factor=1 / scale, mode="bicubic", antialias=True, align_corners=False)
    return F.interpolate(low, size=size, mode="bicubic", align_corners=False).clamp(-1, 1)
