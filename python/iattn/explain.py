"""Explainability: raw attention, rollout, Mamba-Attribution (the C++ methods of iattn/explain/methods.hpp)
and heatmaps written as PNG files without any imaging library."""
from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from ._iattn.explain import (
    bidirectional,
    colorize,
    frozen_gradient,
    gradient_scores,
    mamba_attribution,
    minmax_abs,
    raw_attention,
    rollout,
)

__all__ = [
    "bidirectional",
    "colorize",
    "frozen_gradient",
    "gradient_scores",
    "heatmap",
    "mamba_attribution",
    "minmax_abs",
    "raw_attention",
    "rollout",
    "save_png",
]


def heatmap(M, *, signed: bool = False, scale: int = 1) -> np.ndarray:
    """An (L, L) map as 8-bit RGB (L*scale, L*scale, 3): |M| min-max scaled in viridis, or with signed=True
    the signed values on a symmetric range in blue-white-red (white at 0)."""
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2:
        raise ValueError(f"heatmap: M has shape {M.shape} but expected a 2-D map")
    if not np.isfinite(M).all():
        raise ValueError("heatmap: M has non-finite entries")
    if signed:
        a = np.abs(M).max()
        rgb = colorize(0.5 + M / (2 * a) if a > 0 else np.full_like(M, 0.5), "diverging")
    else:
        rgb = colorize(minmax_abs(M), "viridis")
    if scale > 1:
        rgb = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
    return rgb


def save_png(path: str | os.PathLike, rgb: np.ndarray) -> None:
    """Writes 8-bit RGB (H, W, 3) as a PNG file (written to a temporary name, then renamed: no partial file)."""
    rgb = np.ascontiguousarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"save_png: rgb has shape {rgb.shape} and dtype {rgb.dtype} but expected (H, W, 3) uint8")
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[i].tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(png)
    os.replace(tmp, path)
