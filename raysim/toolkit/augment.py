"""Data augmentation of a client's training batches (``data.augment``), on the client, each batch
from the client's own seeded stream, so that serial and Ray runs give the same numbers.

``crop_flip``: the CIFAR augmentation of FedBABU's code (a base FedDr+ names) and of most pFL codes
for CIFAR-size images, torchvision's ``RandomCrop(size, padding=4)`` then ``RandomHorizontalFlip()``
(FedNTD's code, the base of FedDr+'s global-model table, adds Cutout of 16 pixels after these,
which raysim does not have):

- each image is padded with 4 zeros on every side and a window of its own size is cut out at an
  offset drawn uniformly from 0 to 8 in each direction;
- it is then mirrored left to right with probability 1/2.

The draws are made per image, in batch order, from a generator seeded by (seed, round, client,
stream, epoch). raysim's images are normalised when loaded, so the padding is the dataset's mean
colour, where torchvision pads the raw image with black before normalising (a choice: the border is
the same in every image either way). It applies to the training batches of local updates and of
evaluation-time fine-tuning (:meth:`raysim.toolkit.context.ClientContext.batches`). Passes that
read a client's data for statistics (prototypes, FedPAC's and SphereFed's statistics, PACFL's
subspaces) and every evaluation read it as it is.
"""

from __future__ import annotations

import torch

PAD = 4


def crop_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (B, C, H, W), each image randomly cropped from its 4-padded self and flipped left to
    right with probability 1/2, its draws from ``generator`` (offsets of all images, then flips)."""
    b, _, h, w = x.shape
    dy = torch.randint(0, 2 * PAD + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * PAD + 1, (b,), generator=generator)
    flip = torch.rand(b, generator=generator) < 0.5
    padded = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)  # (B, H)
    cols = dx[:, None] + torch.arange(w)[None, :]  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols).to(x.device)
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous(memory_format=_format_of(x))


def _format_of(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] > 1 else torch.contiguous_format


__all__ = ["PAD", "crop_flip"]
