"""A small TensorBoard event writer on the ``tensorboard`` package alone.

The driver never needs PyTorch for this (``torch.utils.tensorboard`` costs the driver about 1.5 s of
import on start-up); the events are the same protocol buffers TensorBoard reads.
"""

from __future__ import annotations

import time
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

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
