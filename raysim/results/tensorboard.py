"""A small TensorBoard event writer on the ``tensorboard`` package alone.

The driver never needs PyTorch for this (``torch.utils.tensorboard`` costs the driver about 1.5 s of
import on start-up); the events are the same protocol buffers TensorBoard reads.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class EventWriter:
    """Scalars, text and histograms for one run directory."""

    def __init__(self, logdir: str | Path) -> None:
        self._writer = EventFileWriter(str(logdir), flush_secs=10)

    def _add(self, value: summary_pb2.Summary.Value, step: int) -> None:
        event = event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value])
        )
        self._writer.add_event(event)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._add(summary_pb2.Summary.Value(tag=tag, simple_value=float(value)), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self._add(summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor), step)

    def add_histogram(self, tag: str, values: np.ndarray, step: int, bins: int = 20) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        v = v[np.isfinite(v)]
        if v.size == 0:
            return
        counts, edges = np.histogram(v, bins=bins)
        hist = summary_pb2.HistogramProto(
            min=float(v.min()),
            max=float(v.max()),
            num=float(v.size),
            sum=float(v.sum()),
            sum_squares=float((v * v).sum()),
            bucket_limit=[float(e) for e in edges[1:]],
            bucket=[float(c) for c in counts],
        )
        self._add(summary_pb2.Summary.Value(tag=tag, histo=hist), step)

    def add_image(self, tag: str, image: np.ndarray, step: int) -> None:
        """An (H, W) or (H, W, 3) uint8 image."""
        img = np.asarray(image, dtype=np.uint8)
        h, w = img.shape[:2]
        channels = 1 if img.ndim == 2 else img.shape[2]
        summary_image = summary_pb2.Summary.Image(
            height=h, width=w, colorspace=channels, encoded_image_string=encode_png(img)
        )
        self._add(summary_pb2.Summary.Value(tag=tag, image=summary_image), step)

    def purge_from(self, step: int) -> None:
        """A session start at ``step``: TensorBoard drops the events of this run directory's earlier
        event files at ``step`` and after (those a stopped run wrote after its checkpoint)."""
        self._writer.add_event(
            event_pb2.Event(
                wall_time=time.time(),
                step=int(step),
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
            )
        )

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an (H, W) grey or (H, W, 3) RGB uint8 image (8 bits, no filtering)."""
    img = np.ascontiguousarray(image, dtype=np.uint8)
    h, w = img.shape[:2]
    colour = 0 if img.ndim == 2 else 2
    rows = img.reshape(h, -1)
    raw = b"".join(b"\x00" + rows[i].tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def heat_map(matrix: np.ndarray, cell: int = 12) -> np.ndarray:
    """An RGB picture of a matrix with values in [0, 1]: white 0 to dark blue 1, each entry a
    ``cell`` x ``cell`` square (e.g. FedPAC's combination weights, a row per client)."""
    m = np.clip(np.nan_to_num(np.asarray(matrix, dtype=np.float64)), 0.0, 1.0)
    white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
    rgb = (white + m[..., None] * (blue - white)).round().astype(np.uint8)
    return np.repeat(np.repeat(rgb, cell, axis=0), cell, axis=1)
