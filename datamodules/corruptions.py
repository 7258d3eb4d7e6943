"""Image corruptions for a feature shift that does not define a cluster (FedRC's per-client corruptions).

FedRC ("FedRC: Tackling Diverse Distribution Shifts Challenge in Federated Learning by Robust Clustering", Guo et
al., ICML 2024; the authors' released data scripts) gives some clients' images one corruption of the CIFAR-10-C /
MNIST-C kind at a severity from 1 to 5, applied once when the data is made. These are the ones of its
Fashion-MNIST and CIFAR lists that need nothing beyond torch and work on images of any size (the digits are 8 x 8),
with its Fashion-MNIST constants; the blurs, weather, elastic and drawn-line corruptions (scikit-image, Wand,
OpenCV) are left out. Every corruption takes images in [0, 1] of shape (..., H, W) and a torch generator, so a
client's corrupted images are a function of its seed.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Corruption = Callable[[Tensor, int, torch.Generator], Tensor]

SEVERITIES = range(1, 6)


def gaussian_noise(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Add N(0, c^2) to every pixel, c = 0.08 ... 0.38."""
    c = (0.08, 0.12, 0.18, 0.26, 0.38)[severity - 1]
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return (x + c * noise).clamp(0, 1)


def shot_noise(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Poisson(c x) / c: photon noise, c = 60 ... 3 photons at full brightness."""
    c = (60, 25, 12, 5, 3)[severity - 1]
    return (torch.poisson(x * c, generator=generator) / c).clamp(0, 1)


def impulse_noise(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Salt and pepper: a share 0.03 ... 0.27 of the pixels set to 0 or 1, half each (scikit-image's "s&p")."""
    amount = (0.03, 0.06, 0.09, 0.17, 0.27)[severity - 1]
    hit = torch.rand(x.shape, generator=generator, device=x.device) < amount
    salt = torch.rand(x.shape, generator=generator, device=x.device) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


def brightness(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Add c = 0.1 ... 0.5 to every pixel. For a grey image this is FedRC's HSV value shift exactly; on colour
    images FedRC shifts the HSV value, which keeps hue where this does not."""
    c = (0.1, 0.2, 0.3, 0.4, 0.5)[severity - 1]
    return (x + c).clamp(0, 1)


def contrast(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Pull every pixel towards its image's (and channel's) mean by the factor c = 0.4 ... 0.05."""
    c = (0.4, 0.3, 0.2, 0.1, 0.05)[severity - 1]
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return ((x - mean) * c + mean).clamp(0, 1)


def stripe(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Invert the left and right quarters of the columns (FedRC's 7 of 28 on each side); no severity."""
    width = x.shape[-1]
    out = x.clone()
    left, right = width // 4, width - width // 4
    out[..., :left] = 1 - x[..., :left]
    out[..., right:] = 1 - x[..., right:]
    return out


def translate(x: Tensor, severity: int, generator: torch.Generator) -> Tensor:
    """Shift every image by c pixels along each axis, each direction drawn per image, the uncovered border 0; FedRC's
    c = 1 ... 5 of a 28-pixel side, scaled to the image's side (at least one pixel)."""
    shift = max(1, round((1, 2, 3, 4, 5)[severity - 1] * x.shape[-1] / 28))
    signs = torch.randint(0, 2, (len(x), 2), generator=generator, device=x.device) * 2 - 1
    out = torch.zeros_like(x)
    for sy in (-1, 1):
        for sx in (-1, 1):
            rows = (signs[:, 0] == sy) & (signs[:, 1] == sx)
            out[rows] = _shifted(x[rows], sy * shift, sx * shift)
    return out


def _shifted(x: Tensor, dy: int, dx: int) -> Tensor:
    """`x` moved down by dy and right by dx pixels (negative: up, left), the uncovered border 0."""
    out = torch.zeros_like(x)
    height, width = x.shape[-2:]
    ys, yd = (slice(0, height - dy), slice(dy, height)) if dy >= 0 else (slice(-dy, height), slice(0, height + dy))
    xs, xd = (slice(0, width - dx), slice(dx, width)) if dx >= 0 else (slice(-dx, width), slice(0, width + dx))
    out[..., yd, xd] = x[..., ys, xs]
    return out


CORRUPTIONS: dict[str, Corruption] = {
    fn.__name__: fn for fn in (gaussian_noise, shot_noise, impulse_noise, brightness, contrast, stripe, translate)
}


def corrupt(x: Tensor, name: str, severity: int, seed: int) -> Tensor:
    """`x` (uint8 in [0, 255] or floats in [0, 1], shape (n, ..., H, W)) with corruption `name` at `severity`,
    drawn from a generator seeded by `seed`, in `x`'s dtype."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}: choose from {sorted(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"corruption severity must be 1 to 5, got {severity}")
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise ValueError(f"corruptions need images as uint8 or floats in [0, 1], got {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"corruptions need images (n, ..., H, W), got shape {tuple(x.shape)}")
    generator = torch.Generator(device=x.device).manual_seed(seed)
    scale = 255.0 if x.dtype == torch.uint8 else 1.0
    out = CORRUPTIONS[name](x.float() / scale, severity, generator)
    return (out * scale).round().to(x.dtype) if x.dtype == torch.uint8 else out.to(x.dtype)
