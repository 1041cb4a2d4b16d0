"""Image quality against a reference: PSNR and SSIM, per image, on images in [-1, 1].

Both are computed on [0, 1] intensities (the usual data range 1), over all three channels: PSNR from
the mean squared error, SSIM with the standard 11-tap Gaussian window (sigma 1.5) and constants
K1 = 0.01, K2 = 0.03 (Wang et al. 2004), averaged over channels and valid (unpadded) positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WINDOW = 11
SIGMA = 1.5
K1, K2 = 0.01, 0.03


def to_unit(images: torch.Tensor) -> torch.Tensor:
    return ((images.float() + 1) / 2).clamp(0, 1)


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per image, in dB; +inf where the two are identical."""
    mse = (to_unit(pred) - to_unit(target)).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(1.0 / mse)


def _gaussian_window(size: int, sigma: float, channels: int) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g).expand(channels, 1, size, size).contiguous()


def ssim(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per image; 1.0 where the two are identical. Images smaller than the window use a window of
    their own (odd) size, so tiny test images still get a value."""
    x, y = to_unit(pred), to_unit(target)
    channels = x.shape[1]
    size = min(WINDOW, x.shape[-1] - (1 - x.shape[-1] % 2), x.shape[-2] - (1 - x.shape[-2] % 2))
    window = _gaussian_window(size, SIGMA, channels).to(x.device)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    c1, c2 = K1**2, K2**2
    value = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return value.flatten(1).mean(1)
