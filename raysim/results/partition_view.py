"""The data picture: how a partition spreads the labels over the clients.

Every run writes, as it starts, ``partition.png`` (each client's training-label counts as a
heat map: a column per client, a row per class) and ``partition.parquet`` (a row per client: its
training, validation and local-test sizes, how many classes it holds, the entropy of its labels in
nats, and its count of every class), and TensorBoard shows the picture under ``data/partition``.
Under a feature shift (``data.feature_shift``) a band of colour below the map gives each client's
domain, and the table a ``domain`` column.
``raysim partition --dataset fmnist --partition dirichlet:0.1 --clients 100`` draws it without running
anything (:mod:`raysim.commands.partition`). Pillow draws it, cheaply, in a thread of its own once the
run's workers are starting (``SideWork`` in :mod:`raysim.engine.runner`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.data.partition import label_entropy
from raysim.files import replaced_atomically

if TYPE_CHECKING:
    from raysim.data import FederatedData

PICTURE = "partition.png"
TABLE = "partition.parquet"


def partition_table(data: FederatedData, counts: np.ndarray) -> dict[str, list[Any]]:
    """The per-client table, as columns: client, train/val/test sizes, classes held, label entropy
    (nats), and ``count_<c>`` for every class c (``counts``: the training-label counts)."""
    table: dict[str, list[Any]] = {"client": list(range(data.num_clients))}
    if data.client_domains is not None:
        table["domain"] = [int(d) for d in data.client_domains]
    table |= {
        "train_size": [int(n) for n in counts.sum(axis=1)],
        "val_size": [int(v.size) for v in data.client_val],
        "test_size": [int(t.size) for t in data.client_test],
        "classes": [int(n) for n in (counts > 0).sum(axis=1)],
        "label_entropy": [float(h) for h in label_entropy(counts)],
    }
    for c in range(counts.shape[1]):
        table[f"count_{c}"] = [int(n) for n in counts[:, c]]
    return table


#: the colour map of the counts, from none to the most: white to dark blue, on a square-root scale
COLOURS = ((255, 255, 255), (158, 202, 225), (49, 130, 189), (8, 48, 107))


def colour_of(counts: np.ndarray, vmax: int) -> np.ndarray:
    """The RGB colour (uint8, shape ``counts.shape + (3,)``) of each count: ``sqrt(count / vmax)``
    placed on :data:`COLOURS`, linearly between its stops (a few samples already show)."""
    t = np.sqrt(np.clip(np.asarray(counts, dtype=np.float64) / max(1, vmax), 0.0, 1.0))
    stops = np.linspace(0.0, 1.0, len(COLOURS))
    table = np.asarray(COLOURS, dtype=np.float64)
    rgb = np.stack([np.interp(t, stops, table[:, k]) for k in range(3)], axis=-1)
    return np.rint(rgb).astype(np.uint8)


def _nice_ticks(top: float, most: int = 8) -> list[int]:
    """Round numbers 0, step, 2 step, ... up to ``top``, at most ``most`` of them, the step 1, 2 or 5
    times a power of ten."""
    top = max(0, int(top))
    step = 1
    while top // step + 1 > most:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2  # 1, 2, 5, 10, 20, 50, ...
    return list(range(0, top + 1, step))


#: the domains' colours under a feature shift (Tableau 10's), domain d's the d-th, round again past 10
DOMAIN_COLOURS = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
BAND = 12  #: the height of the domains' band, in pixels
LINE = 18  #: a line of text in the picture, in pixels
LEFT = 70  #: the heat map's left edge (the class axis's ticks and label go before it)


def heat_top(title: str) -> int:
    """The heat map's top edge: below the title's line, if there is a title."""
    return 2 * LINE if title else LINE


def cell_geometry(n_clients: int, n_classes: int) -> tuple[int, int]:
    """Pixels per client (width) and per class (height) of the heat map's cells."""

    def size(n: int, most: int, span: int, least: int) -> int:  # at least `least` pixels in all
        return max(1, min(most, span // max(1, n)), -(-least // max(1, n)))

    return size(n_clients, 14, 1200, 240), size(n_classes, 24, 480, 160)


def draw_counts(
    counts: np.ndarray, path: str | os.PathLike[str], title: str = "", domains: np.ndarray | None = None
) -> Path:
    """``counts`` (clients x classes) as a heat map PNG at ``path``: a column per client, a row per
    class (class 0 at the bottom), each cell the colour of its count (:func:`colour_of`; white:
    none), with the axes' ticks, the title and a colour bar. ``domains`` (a feature shift's, one
    per client): a band below the map, each client's column in its domain's colour
    (:data:`DOMAIN_COLOURS`), and their legend below the client axis. Drawn with Pillow alone:
    matplotlib's import and layout took about 1.4 s of CPU at every run's start, beside Ray's."""
    from PIL import Image, ImageDraw, ImageFont

    counts = np.asarray(counts)
    n_clients, n_classes = counts.shape
    cw, ch = cell_geometry(n_clients, n_classes)
    vmax = max(1, int(counts.max()))
    heat = colour_of(counts.T[::-1], vmax)  # rows: the classes, the last at the top
    heat = np.repeat(np.repeat(heat, ch, axis=0), cw, axis=1)
    font = ImageFont.load_default(size=13)
    line, left, top = LINE, LEFT, heat_top(title)
    band = 0 if domains is None else BAND + 2  # the domains' band and the gap above it
    bottom, right = 3 * line + band + (0 if domains is None else line), 140
    w, h = heat.shape[1], heat.shape[0]
    text_w = int(font.getlength(title)) + 40 if title else 0
    width = max(left + w + right, text_w)
    img = Image.new("RGB", (width, top + max(h, int(font.getlength("training samples")) + 10) + bottom), "white")
    img.paste(Image.fromarray(heat), (left, top))
    pen = ImageDraw.Draw(img)
    pen.rectangle((left - 1, top - 1, left + w, top + h), outline="black")
    if title:
        pen.text((width / 2, line / 2), title, fill="black", font=font, anchor="mt")
    if domains is not None:  # each client's domain, a band below its column
        palette = np.asarray(DOMAIN_COLOURS, dtype=np.uint8)
        strip = palette[np.asarray(domains, dtype=np.int64) % len(palette)][None, :, :]
        strip = np.repeat(np.repeat(strip, BAND, axis=0), cw, axis=1)
        img.paste(Image.fromarray(np.ascontiguousarray(strip)), (left, top + h + 2))
        pen.rectangle((left - 1, top + h + 1, left + w, top + h + 2 + BAND), outline="black")
        pen.text((left - 8, top + h + 2 + BAND / 2), "domain", fill="black", font=font, anchor="rm")
    for c in _nice_ticks(n_clients - 1, 11):  # clients along the bottom
        x = left + c * cw + cw / 2
        pen.line((x, top + h + band, x, top + h + band + 4), fill="black")
        pen.text((x, top + h + band + 6), str(c), fill="black", font=font, anchor="mt")
    pen.text(
        (left + w / 2, top + h + band + line + 10),
        f"client (0-{n_clients - 1})",
        fill="black",
        font=font,
        anchor="mt",
    )
    if domains is not None:  # the legend: a swatch and the number of each domain
        lx, ly = left, top + h + band + 2 * line + 10
        for d in range(int(np.max(domains)) + 1):
            step = 14 + int(font.getlength(f"domain {d}")) + 12
            if lx + step > width:  # no room for more: the colours say the rest
                pen.text((lx, ly + 5), "...", fill="black", font=font, anchor="lm")
                break
            pen.rectangle(
                (lx, ly, lx + 10, ly + 10), fill=DOMAIN_COLOURS[d % len(DOMAIN_COLOURS)], outline="black"
            )
            pen.text((lx + 14, ly + 5), f"domain {d}", fill="black", font=font, anchor="lm")
            lx += step
    classes = range(n_classes) if n_classes <= 20 else _nice_ticks(n_classes - 1, 11)
    for k in classes:  # classes up the left side
        y = top + h - k * ch - ch / 2
        pen.line((left - 5, y, left - 1, y), fill="black")
        pen.text((left - 8, y), str(k), fill="black", font=font, anchor="rm")

    def upright(label: str, x: int) -> None:  # a label written bottom to top, centred on the map
        side = Image.new("RGB", (int(font.getlength(label)) + 4, line), "white")
        ImageDraw.Draw(side).text((2, line / 2), label, fill="black", font=font, anchor="lm")
        side = side.rotate(90, expand=True)
        img.paste(side, (x, int(top + h / 2 - side.height / 2)))

    upright(f"class (0-{n_classes - 1})", 6)
    # the colour bar: the scale from 0 (bottom) to the largest count (top), ticked at round counts
    bx = left + w + 16
    bar = colour_of((np.linspace(1, 0, h) ** 2 * vmax)[:, None].repeat(14, axis=1), vmax)  # sqrt scale
    img.paste(Image.fromarray(bar), (bx, top))
    pen.rectangle((bx - 1, top - 1, bx + 14, top + h), outline="black")
    for v in _nice_ticks(vmax, 7 if h >= 120 else 3):
        y = top + h - 1 - float(np.sqrt(v / vmax)) * (h - 1)
        pen.line((bx + 14, y, bx + 18, y), fill="black")
        pen.text((bx + 21, y), str(v), fill="black", font=font, anchor="lm")
    upright("training samples", bx + 21 + int(font.getlength(str(vmax))) + 12)
    out = Path(path)
    img.save(out, format="PNG")
    return out


def describe(counts: np.ndarray, partition: str, dataset: str) -> str:
    """The picture's title: dataset, partition, clients, sizes and mean label entropy."""
    sizes = counts.sum(axis=1)
    return (
        f"{dataset}, {partition}, {len(counts)} clients: {int(sizes.min())}-{int(sizes.max())} samples "
        f"a client, {float((counts > 0).sum(axis=1).mean()):.1f} classes and label entropy "
        f"{float(label_entropy(counts).mean()):.2f} nats on average"
    )


def write_partition(data: FederatedData, picture: str | os.PathLike[str], partition: str, dataset: str) -> str:
    """The picture at ``picture`` (a run's ``partition.png``) and the table beside it (``.parquet``),
    each written whole or not at all (a run draws them beside its start, and its TensorBoard writer
    reads the picture once it is there); returns the picture's title."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(picture)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = data.train_label_counts()
    with replaced_atomically(out.with_suffix(".parquet")) as tmp:
        pq.write_table(pa.table(partition_table(data, counts)), tmp)
    title = describe(counts, partition, dataset)
    if data.client_domains is not None:
        title += f"; {data.num_domains} feature domains"
    with replaced_atomically(out) as tmp:
        draw_counts(counts, tmp, title, data.client_domains)
    return title


def read_picture(path: str | os.PathLike[str]) -> np.ndarray:
    """A PNG as an HxWx3 uint8 array (for TensorBoard)."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


__all__ = ["BAND", "COLOURS", "DOMAIN_COLOURS", "LEFT", "LINE", "PICTURE", "TABLE", "cell_geometry", "colour_of", "describe", "draw_counts", "heat_top", "partition_table", "read_picture", "write_partition"]
