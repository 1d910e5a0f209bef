"""Matplotlib set up once for files (Agg, no display) and the two ways a figure leaves us:
a PNG file, or PNG bytes inlined in HTML as a ``data:`` URI."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

DPI = 100


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` and free it."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """``fig`` as PNG bytes (the figure is freed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def data_uri(png: bytes | Path) -> str:
    """A ``data:image/png;base64,...`` URI of PNG bytes or of a PNG file."""
    raw = png.read_bytes() if isinstance(png, Path) else png
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


__all__ = ["Figure", "data_uri", "plt", "png_bytes", "save"]
