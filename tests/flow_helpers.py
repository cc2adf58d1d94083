"""What the FLUX.1 tests share."""

import torch

FLUX_LINEAR1_SIZES = (3072, 3072, 3072, 12288)


def scale_diffusers_flux_split(monkeypatch) -> None:
    """diffusers 0.42's FLUX converter splits ``linear1`` with FLUX.1's fixed sizes (3072 x 3 +
    12288); scale those sizes to the file's width so that the rest of its code runs as is on the
    tiny model."""
    real = torch.split

    def split(tensor, sizes, dim=0):
        if isinstance(sizes, (tuple, list)) and tuple(sizes) == FLUX_LINEAR1_SIZES \
                and tensor.shape[0] != sum(sizes):
            width = tensor.shape[0] // 7  # 3 x width + 4 x width (mlp_ratio 4)
            sizes = (width, width, width, 4 * width)
        return real(tensor, sizes, dim)

    monkeypatch.setattr(torch, "split", split)
