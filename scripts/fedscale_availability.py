"""Convert a FedScale availability trace to raysim's availability trace (raysim.deployment.traces).

FedScale's trace (its ``client_behave_trace``, given as ``--device_avail_file``) is a pickle of
``{client_id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s, ...}}``. What FedScale
does with it (SymbioticLab/FedScale):

- ``fedscale/cloud/client_manager.py``, ``ClientManager.__init__`` loads the pickle and keeps its keys
  in the pickle's order; ``ClientManager.register_client`` gives FedScale's client ``k`` (numbered
  from 1 by ``Aggregator.client_register_handler``) the entry of the ``k mod n``-th key.
- ``fedscale/cloud/internal/client_metadata.py``, ``ClientMetadata.is_active(cur_time)`` takes
  ``cur_time % finish_time`` and calls the client active if it lies in ``[active[i], inactive[i]]``
  (both ends in) for the pair ``i`` under a cursor (``behavior_index``); so a client's trace repeats
  every ``finish_time`` seconds, its own. The cursor moves on at most one pair a call and is not
  put back when a period begins, so FedScale answers the rule above only while it is asked at least
  once per interval, in time order, within a period; the converter follows the rule (the method's
  docstring: whether the client is active at ``cur_time``), as raysim's ``online`` keeps no state.

A client's pair ``i`` becomes the row ``client,active[i],inactive[i]``, in seconds. Clients are
numbered from 0 in the order of their ids, as ``scripts/fedscale_devices.py`` numbers them (not in
the pickle's order, which FedScale uses; the two agree where the ids were inserted in ascending
order). raysim ends an interval just before ``end_s``, FedScale at ``inactive[i]``: they differ at
that instant only. A client with no intervals (empty lists) is left out, said in a note on stderr.

raysim repeats one trace over its span, its latest ``end_s``; FedScale repeats each client over its
own ``finish_time``. Where the finish times differ, each client's intervals are repeated over its
own finish time up to the longest one, P, which is exact for the first P seconds and, after them,
for every client whose finish time divides P (a note on stderr names the others). Where no client is
online at P, the CSV's span (its latest ``end_s``, L) is shorter than FedScale's period: a note on
stderr says so, and ``--keep-period`` shifts every interval P - L seconds later, which keeps the
period and each client's time online (FedScale's second t is then raysim's t + P - L). A trace that
cannot be converted (an interval that ends before it starts; lists of unequal length, a time
that is not a finite number at least 0, a ``finish_time`` before the client's latest ``inactive``
time, a client id that is not a whole number, no client with an interval) ends in one sentence and
exit status 2. An interval of no length, which FedScale counts online at its one instant (its own
test data has them), is left out: raysim's trace cannot hold one, and no work fits in it.

    python scripts/fedscale_availability.py client_behave_trace availability.csv
    python scripts/run.py --set deployment.availability=trace \\
        --set deployment.availability_file=availability.csv ...
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raysim.commands.flags import Parser  # noqa: E402
from raysim.deployment.traces import article, read_fedscale_pickle, write_trace_csv  # noqa: E402
from raysim.errors import ConfigError  # noqa: E402

PROG = "fedscale_availability.py"
FIELDS = ("client", "start_s", "end_s")
SHAPE = "a pickle of {client_id: {'active': [s, ...], 'inactive': [s, ...], 'finish_time': s}}"
#: the most rows that repeating clients over the longest finish time may write
MAX_ROWS = 5_000_000


def read_trace(path: str) -> dict[Any, Any]:
    """FedScale's availability trace from the pickle ``path``; a file that is not one is a ConfigError."""
    return read_fedscale_pickle(path, "availability", SHAPE, "deployment.availability_file", "clients")


def _client_id(key: Any) -> int:
    """The whole number a FedScale client id is (an int, a whole float, or the text of one)."""
    value: Any = key
    if isinstance(key, str):
        try:
            value = int(key.strip())
        except ValueError:
            value = None
    elif isinstance(key, numbers.Real) and not isinstance(key, bool):
        value = int(key) if math.isfinite(key) and float(key).is_integer() else None
    else:
        value = None
    if value is None:
        raise ConfigError(
            f"The client id {key!r} is not a whole number; raysim numbers clients by their ids."
        )
    return int(value)


def _seconds(value: Any, client: Any, what: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"Client {client!r}'s {what} is not a number ({value!r}).")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        least = "above 0" if positive else "at least 0"
        raise ConfigError(f"Client {client!r}'s {what} must be a finite number {least}, not {seconds:g}.")
    return seconds


def _times(entry: Mapping[str, Any], key: str, client: Any) -> list[Any]:
    times = entry[key]
    if isinstance(times, (str, bytes, Mapping)) or not hasattr(times, "__len__"):
        raise ConfigError(f"Client {client!r}'s {key} is {article(times)}, not a list of seconds ({SHAPE}).")
    return list(times)


@dataclass
class Converted:
    """raysim's rows, FedScale's period, and the clients left out (each with no interval)."""

    rows: list[tuple[int, float, float]]
    period_s: float
    clients: int
    skipped: list[Any] = field(default_factory=list)
    #: the clients (FedScale id, finish time) whose finish time does not divide the period
    off_period: list[tuple[Any, float]] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        """The period raysim reads from the rows: their latest end."""
        return max(end for _, _, end in self.rows)


def _intervals(key: Any, entry: Any) -> tuple[list[tuple[float, float]], float]:
    """Client ``key``'s online intervals and finish time, each checked."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"Client {key!r}'s entry is {article(entry)}, not a dict ({SHAPE}).")
    missing = [k for k in ("active", "inactive", "finish_time") if k not in entry]
    if missing:
        raise ConfigError(f"Client {key!r}'s entry has no {' and no '.join(missing)} ({SHAPE}).")
    active, inactive = _times(entry, "active", key), _times(entry, "inactive", key)
    if len(active) != len(inactive):
        raise ConfigError(
            f"Client {key!r} has {len(active)} active times but {len(inactive)} inactive times; "
            "FedScale pairs them as the client's online intervals."
        )
    finish = _seconds(entry["finish_time"], key, "finish_time", positive=True)
    intervals = []
    for i, (a, b) in enumerate(zip(active, inactive, strict=True)):
        start, end = _seconds(a, key, f"active[{i}]"), _seconds(b, key, f"inactive[{i}]")
        if end == start:  # an instant online (FedScale's own test data has them): no work fits in it
            continue
        if end < start:
            raise ConfigError(
                f"Client {key!r}'s interval {i} ends at {end:g} s (inactive[{i}]), "
                f"before it starts at {start:g} s (active[{i}])."
            )
        intervals.append((start, end))
    latest = max((end for _, end in intervals), default=0.0)
    if finish < latest:
        raise ConfigError(
            f"Client {key!r}'s finish_time ({finish:g} s) is before its latest inactive time ({latest:g} s); "
            "FedScale repeats a client's trace every finish_time seconds."
        )
    return intervals, finish


def convert(trace: Mapping[Any, Any], *, keep_period: bool = False) -> Converted:
    """raysim's rows of a FedScale availability trace, its clients in the order of their ids
    (renumbered from 0); see the module docstring."""
    ids: dict[int, Any] = {}
    for key in trace:
        number = _client_id(key)
        if number in ids:
            raise ConfigError(f"The client ids {ids[number]!r} and {key!r} are the same number, {number}.")
        ids[number] = key
    kept: list[tuple[Any, list[tuple[float, float]], float]] = []
    skipped = []
    for number in sorted(ids):
        key = ids[number]
        intervals, finish = _intervals(key, trace[key])
        if intervals:
            kept.append((key, intervals, finish))
        else:
            skipped.append(key)
    if not kept:
        raise ConfigError(
            f"No client of the trace's {len(trace)} has an online interval (each one's active list is empty)."
        )
    period = max(finish for _, _, finish in kept)
    rows: list[tuple[int, float, float]] = []
    for client, (key, intervals, finish) in enumerate(kept):
        repeats = math.ceil(period / finish)
        if len(rows) + repeats * len(intervals) > MAX_ROWS:
            raise ConfigError(
                f"Repeating client {key!r}'s trace (finish_time {finish:g} s) over "
                f"the longest finish_time ({period:g} s) takes over {MAX_ROWS:,} rows, more than a CSV trace "
                "should hold."
            )
        for k in range(repeats):
            for start, end in intervals:
                if k * finish + start < period:
                    rows.append((client, k * finish + start, min(k * finish + end, period)))
    off_period = [(key, finish) for key, _, finish in kept if not (period / finish).is_integer()]
    out = Converted(rows, period, len(kept), skipped, off_period)
    if keep_period and out.span_s < period:
        shift = period - out.span_s
        out.rows = [(c, start + shift, end + shift) for c, start, end in rows]
    return out


def _text(seconds: float) -> str:
    return str(int(seconds)) if seconds.is_integer() else repr(seconds)


def write(rows: list[tuple[int, float, float]], out: str) -> None:
    write_trace_csv(out, FIELDS, ((client, _text(start), _text(end)) for client, start, end in rows), "availability.csv")


def notes(converted: Converted, keep_period: bool) -> list[str]:
    """One sentence for each way the CSV differs from FedScale's trace."""
    said = []
    if converted.skipped:
        n = len(converted.skipped)
        first = f"{converted.skipped[0]!r}{' first' if n > 1 else ''}"
        said.append(
            f"{n} client{'s' if n > 1 else ''} with no online interval ({first}) "
            f"{'were' if n > 1 else 'was'} left out, so raysim numbers the rest ({converted.clients}) from 0."
        )
    span, period = converted.span_s, converted.period_s
    if converted.off_period:
        n, (key, finish) = len(converted.off_period), converted.off_period[0]
        which = f"{n} clients ({key!r}'s first: {finish:g} s)" if n > 1 else f"client {key!r} ({finish:g} s)"
        said.append(
            f"The finish_time of {which} does not divide the longest ({period:g} s), so raysim restarts "
            f"{'them' if n > 1 else 'it'} every {period:g} s where FedScale repeats each client over its own."
        )
    if span < period and not keep_period:
        said.append(
            f"FedScale repeats this trace every {period:g} s but raysim repeats the CSV over its latest "
            f"end_s ({span:g} s), as no client is online at {period:g} s; --keep-period shifts the "
            f"intervals {period - span:g} s later to keep FedScale's period."
        )
    return said


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("trace", help="FedScale's availability pickle (e.g. client_behave_trace)")
    p.add_argument("out", help="the CSV to write")
    p.add_argument(
        "--keep-period",
        action="store_true",
        help="shift the intervals later so that the CSV's span is FedScale's period",
    )
    try:
        args = p.parse_args(argv)
        converted = convert(read_trace(args.trace), keep_period=args.keep_period)
        write(converted.rows, args.out)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    for note in notes(converted, args.keep_period):
        print(f"{PROG}: note: {note}", file=sys.stderr)
    clients = f"{converted.clients} client{'s' if converted.clients > 1 else ''}"
    print(
        f"{len(converted.rows)} online intervals of {clients} written to {args.out} (period {converted.span_s:g} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
