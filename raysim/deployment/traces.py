"""Trace files of a deployment (docs/design.md, "Simulated deployments"): per-client availability
intervals and per-client devices, as CSV files with a header.

Availability (``deployment.availability=trace``, ``deployment.availability_file``)::

    client,start_s,end_s
    0,0,3600
    0,7200,9000
    1,1800,5400

Each row is an interval of simulated seconds in which the trace's client is online. The trace is
periodic over its span (the latest ``end_s``), as a week-long behaviour trace replayed; raysim's
client ``i`` follows the trace's ``i mod n``-th client (its clients by id), so a trace of fewer
clients is reused. A client can be sampled when it is online (at a round's start; in async mode
when a place is free), and its update is lost if it goes offline before its upload
(:meth:`AvailabilityTrace.offline_at`).

Devices (``deployment.devices=trace``, ``deployment.devices_file``)::

    client,seconds_per_sample,down_mbps,up_mbps,latency_s
    0,0.0021,18.5,4.1,0.05

``latency_s`` may be left out (then ``deployment.latency_s``), and ``seconds_per_sample`` may be
given instead as ``speed``, a multiplier of ``deployment.seconds_per_sample`` (2: twice as slow), a
base measured once with ``scripts/bench/seconds_per_sample.py``.
A trace gives a device's compute in one of the two columns, not both. Clients map to rows as in
the availability trace. A FedScale device trace (a pickle of
``{client_id: {"computation": ms_per_sample, "communication": kbit_per_s}}``) converts with
``python scripts/fedscale_devices.py IN.pkl OUT.csv``: FedScale times a sample's training as three
times its ``computation`` milliseconds (forward and backward) and uses one bandwidth both ways,
in kilobits of 1,024 bits. A FedScale behaviour trace (a pickle of ``{client_id: {"active": [...],
"inactive": [...], "finish_time": T}}``) converts to an availability trace with
``python scripts/fedscale_availability.py IN.pkl OUT.csv``.

Both are read when the driver checks the deployment (:func:`raysim.deployment.model.check`), and
what a user gets wrong is one sentence naming the file and line: a column raysim does not read
(the nearest known one named, with its unit), a column twice, a line of another length than the
header, a number that is not finite and at least 0 (a speed and a bandwidth above 0), a client
id that is not whole, a device client twice, a file that is not comma-separated text.
"""

from __future__ import annotations

import csv
import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from raysim.deployment.clock import Device
from raysim.errors import ConfigError

MEGABIT = 1e6 / 8  # bytes a second in one megabit a second

#: each trace's columns: those it needs, and those it may have
AVAILABILITY_COLUMNS = (("client", "start_s", "end_s"), ())
DEVICE_COLUMNS = (("client", "down_mbps", "up_mbps"), ("seconds_per_sample", "speed", "latency_s"))
#: the units of the columns that have them, said where a column's name is mistaken
UNITS = {
    "start_s": "seconds",
    "end_s": "seconds",
    "seconds_per_sample": "seconds",
    "down_mbps": "megabits a second",
    "up_mbps": "megabits a second",
    "latency_s": "seconds",
}
#: how each trace's FedScale pickle converts, said where a pickle is given as a trace
CONVERT = {
    "device": "a FedScale device pickle converts with scripts/fedscale_devices.py",
    "availability": "a FedScale behaviour trace converts with scripts/fedscale_availability.py",
}


def _rows(
    path: str, columns: tuple[tuple[str, ...], tuple[str, ...]], what: str
) -> list[tuple[int, dict[str, str]]]:
    """The rows of the trace ``path``, each its line number and a dict of its columns' texts (blank
    lines skipped), once its header and each line's number of fields are checked: every column one
    of ``columns`` (those it needs, and those it may have), none twice, the needed ones there. A
    column name's surrounding spaces and a UTF-8 byte-order mark (a spreadsheet's CSV) are left out."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"The {what} trace {path} does not exist.")
    if not file.is_file():
        raise ConfigError(f"The {what} trace {path} is a directory, not a CSV file.")
    required, optional = columns
    try:
        with open(file, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [name.strip() for name in next(reader, [])]
            lines = [(reader.line_num, fields) for fields in reader if fields]
    except UnicodeDecodeError:
        also = f"; {CONVERT[what]}" if what in CONVERT else ""
        raise ConfigError(f"The {what} trace {path} is not a CSV text file{also}.") from None
    except csv.Error as e:
        raise ConfigError(f"The {what} trace {path} does not parse as CSV ({e}).") from None
    _check_header(header, required, optional, path, what)
    rows = []
    for line, fields in lines:
        if len(fields) != len(header):
            raise ConfigError(
                f"Line {line} of {path} has {len(fields)} fields, not the {len(header)} of its header's columns."
            )
        rows.append((line, dict(zip(header, fields, strict=True))))
    if not rows:
        raise ConfigError(f"The {what} trace {path} has no rows.")
    return rows


def _check_header(
    header: list[str], required: tuple[str, ...], optional: tuple[str, ...], path: str, what: str
) -> None:
    known = (*required, *optional)
    listed = ", ".join(required) + (f" (and optionally {', '.join(optional)})" if optional else "")
    if len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
        raise ConfigError(
            f"The {what} trace {path} is not comma-separated: its header is {header[0]!r}, not {listed}."
        )
    for i, name in enumerate(header):
        if not name:
            raise ConfigError(f"Column {i + 1} of the {what} trace {path} has no name in its header.")
        if name in header[:i]:
            raise ConfigError(f"The {what} trace {path} has the column {name} twice.")
        if name not in known:
            near = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
            unit = f", in {UNITS[near[0]]}" if near and near[0] in UNITS else ""
            guess = f" (did you mean {near[0]}{unit}?)" if near else ""
            raise ConfigError(
                f"The {what} trace {path} has a column {name!r}{guess}, which raysim does not read; "
                f"its columns are {listed}."
            )
    missing = [c for c in required if c not in header]
    if missing:
        raise ConfigError(f"The {what} trace {path} lacks the column(s) {', '.join(missing)}.")


def _number(row: dict[str, str], key: str, path: str, line: int, *, positive: bool = False) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        raise ConfigError(f"Line {line} of {path}: {key} is not a number ({row.get(key)!r}).") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        least = "above 0" if positive else "at least 0"
        raise ConfigError(f"Line {line} of {path}: {key} must be a finite number {least}, not {value:g}.")
    return value


def _client(row: dict[str, str], path: str, line: int) -> int:
    value = _number(row, "client", path, line)
    if not value.is_integer():
        raise ConfigError(
            f"Line {line} of {path}: client must be a whole number (a client id), not {value:g}."
        )
    return int(value)


@dataclass(frozen=True)
class AvailabilityTrace:
    """Per trace client, its sorted online intervals; periodic over ``span_s``."""

    intervals: tuple[tuple[tuple[float, float], ...], ...]
    span_s: float

    @classmethod
    def read(cls, path: str) -> AvailabilityTrace:
        by_client: dict[int, list[tuple[float, float]]] = {}
        for line, row in _rows(path, AVAILABILITY_COLUMNS, "availability"):
            start, end = _number(row, "start_s", path, line), _number(row, "end_s", path, line)
            if end <= start:
                raise ConfigError(
                    f"Line {line} of {path}: end_s ({end:g}) must be after start_s ({start:g})."
                )
            by_client.setdefault(_client(row, path, line), []).append((start, end))
        span = max(e for iv in by_client.values() for _, e in iv)
        return cls(tuple(tuple(sorted(by_client[c])) for c in sorted(by_client)), span)

    def online(self, client: int, now_s: float) -> bool:
        t = now_s % self.span_s
        return any(s <= t < e for s, e in self.intervals[client % len(self.intervals)])

    def next_online_s(self, now_s: float, clients: Sequence[int]) -> float:
        """Seconds from ``now_s`` until one of raysim's ``clients`` (each following the trace's
        ``i mod n``-th client) is online (0 if one is; infinite for no clients). Only the trace
        clients the run follows count: a trace is usually far larger than the run."""
        t = now_s % self.span_s
        followed = {c % len(self.intervals) for c in clients}
        waits = [
            (s - t) if s > t else (0.0 if t < e else self.span_s - t + s)
            for i in followed
            for s, e in self.intervals[i]
        ]
        return min(waits, default=math.inf)

    def offline_at(self, client: int, start_s: float, end_s: float) -> float | None:
        """When ``client`` goes offline in [``start_s``, ``end_s``) (None: it stays online
        throughout): the end of the interval it is in, unless another one goes on from there."""
        ivs = self.intervals[client % len(self.intervals)]
        t = start_s
        while t < end_s:
            phase = t % self.span_s
            ends = [e for s, e in ivs if s <= phase < e]
            if not ends:
                return t
            nxt = t - phase + max(ends)
            if nxt <= t:  # rounding at an interval's end: it ends here
                return t
            t = nxt
        return None


def read_devices(path: str, base: Device) -> tuple[Device, ...]:
    """The trace's devices by client id (see the module docstring)."""
    rows = _rows(path, DEVICE_COLUMNS, "device")
    given = set(rows[0][1])
    if {"seconds_per_sample", "speed"} <= given:
        raise ConfigError(
            f"The device trace {path} has both a seconds_per_sample and a speed column; give a device's "
            "compute in one of them (speed: a multiple of deployment.seconds_per_sample)."
        )
    if not {"seconds_per_sample", "speed"} & given:
        raise ConfigError(
            f"The device trace {path} gives neither seconds_per_sample nor speed (one of the two columns)."
        )
    out: dict[int, Device] = {}
    first: dict[int, int] = {}
    for line, row in rows:
        if "speed" in row:
            per_sample = base.seconds_per_sample * _number(row, "speed", path, line, positive=True)
        else:
            per_sample = _number(row, "seconds_per_sample", path, line)
        down = _number(row, "down_mbps", path, line, positive=True)
        up = _number(row, "up_mbps", path, line, positive=True)
        latency = (
            _number(row, "latency_s", path, line) if row.get("latency_s", "").strip() else base.latency_s
        )
        client = _client(row, path, line)
        if client in first:
            raise ConfigError(
                f"Lines {first[client]} and {line} of {path} both give client {client}'s device."
            )
        first[client] = line
        out[client] = Device(per_sample, down * MEGABIT, up * MEGABIT, latency)
    return tuple(out[c] for c in sorted(out))


def article(value: object) -> str:
    """``value``'s type with its article: "a list", "an int"."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _is_text(head: bytes) -> bool:
    """Whether a file that begins with ``head`` is text (UTF-8, no control bytes but white space),
    as no pickle of a dict is: each begins with a protocol byte, or protocol 0's ``(``."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and not text.startswith("(") and all(c.isprintable() or c in "\r\n\t" for c in text)


def read_fedscale_pickle(path: str, what: str, shape: str, setting: str, empty: str) -> dict[object, object]:
    """FedScale's ``what`` trace ("device", "availability") from the pickle ``path``, a dict by
    client id, for the converters in ``scripts/``; a file that is not one is a one-sentence
    ConfigError (``shape``: the pickle's shape; ``setting``: the setting that reads raysim's CSV;
    ``empty``: what a dict with no entries holds no of)."""
    import pickle
    from collections.abc import Mapping

    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"The FedScale {what} trace {path} does not exist.")
    if not file.is_file():
        raise ConfigError(f"The FedScale {what} trace {path} is a directory, not a file ({shape}).")
    try:
        with open(file, "rb") as f:
            text = _is_text(f.read(4096))
            f.seek(0)
            trace = None if text else pickle.load(f)  # a file the user names: FedScale's format is a pickle
    except OSError as e:
        raise ConfigError(f"The FedScale {what} trace {path} cannot be read ({e.strerror or e}).") from None
    except Exception as e:  # unpickling a file that is not a pickle fails in many ways
        raise ConfigError(
            f"{path} is not a pickle ({type(e).__name__}: {str(e).rstrip('.')}); FedScale's {what} trace is {shape}."
        ) from None
    if text:
        raise ConfigError(
            f"{path} is a text file, not a pickle: FedScale's {what} trace is {shape} "
            f"(a CSV in raysim's columns is read as it is by {setting})."
        )
    if not isinstance(trace, Mapping):
        raise ConfigError(f"{path} holds {article(trace)}, not FedScale's {what} trace ({shape}).")
    if not trace:
        raise ConfigError(f"{path} holds no {empty}.")
    return dict(trace)


def write_trace_csv(out: str, header: Sequence[str], rows: Iterable[Sequence[object]], example: str) -> None:
    """``rows`` under ``header`` to the CSV file ``out``, for the converters in ``scripts/``; an
    output that cannot be written (a directory, a missing folder, no permission) is a
    one-sentence ConfigError (``example``: a file name to suggest)."""
    path = Path(out).expanduser()
    if path.is_dir():
        raise ConfigError(f"{out} is a directory; name the CSV to write, e.g. {path / example}.")
    if not path.parent.is_dir():
        raise ConfigError(f"{out}: the folder {path.parent} does not exist.")
    try:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    except OSError as e:
        raise ConfigError(f"{out} cannot be written ({e.strerror or e}).") from None


__all__ = ["MEGABIT", "AvailabilityTrace", "article", "read_devices", "read_fedscale_pickle", "write_trace_csv"]
