"""Convert a FedScale device trace to raysim's device trace (raysim.deployment.traces).

FedScale's trace is a pickle of ``{client_id: {"computation": ms, "communication": kbps, ...}}``
(optionally with ``dl_kbps`` and ``ul_kbps``). FedScale times a client's training as
``3 * batch_size * steps * computation / 1000`` seconds (the factor 3 for the forward and backward
passes) and its transfers as kilobits over ``communication`` kilobits a second, both ways
(``fedscale/cloud/internal/client_metadata.py``, ``ClientMetadata.get_completion_time``). Its
kilobit is 1,024 bits: the model's size is ``sys.getsizeof(pickle.dumps(model)) / 1024.0 * 8``
kilobits (``fedscale/cloud/aggregation/aggregator.py``, ``Aggregator.run``). So a client's
``seconds_per_sample`` is ``3 * computation / 1000``, and its bandwidths ``dl_kbps`` and
``ul_kbps`` (else ``communication``) times 1,024 / 1,000,000 in megabits a second (1,000 kbit/s is
1.024 Mbit/s).

    python scripts/fedscale_devices.py client_device_capacity devices.csv
    python scripts/run.py --set deployment.devices=trace --set deployment.devices_file=devices.csv ...
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raysim.commands.flags import Parser  # noqa: E402
from raysim.deployment.traces import read_fedscale_pickle, write_trace_csv  # noqa: E402
from raysim.errors import ConfigError  # noqa: E402

FIELDS = ("client", "seconds_per_sample", "down_mbps", "up_mbps")
SHAPE = "a pickle of {client_id: {'computation': ms, 'communication': kbps}}"
BITS_PER_KBIT = 1024  # FedScale's kilobit (see the module docstring)


def read_trace(path: str) -> dict[Any, Any]:
    """FedScale's device trace from the pickle ``path``; a file that is not one is a ConfigError."""
    return read_fedscale_pickle(path, "device", SHAPE, "deployment.devices_file", "client devices")


def _value(dev: Mapping[str, Any], key: str, client: Any, *, positive: bool) -> float:
    try:
        value = float(dev[key])
    except (TypeError, ValueError):
        raise ConfigError(f"Client {client!r}'s {key} is not a number ({dev[key]!r}).") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(
            f"Client {client!r}'s {key} must be a number {'above' if positive else 'at least'} 0, not {value:g}."
        )
    return value


def convert(trace: Mapping[Any, Any]) -> list[dict[str, Any]]:
    """raysim's rows of a FedScale trace, in the order of its client ids (renumbered from 0)."""
    try:
        keys = sorted(trace)
    except TypeError:
        raise ConfigError(
            "The trace's client ids are of mixed kinds (numbers and texts), so they have no order."
        ) from None
    rows = []
    for i, key in enumerate(keys):
        dev = trace[key]
        if not isinstance(dev, Mapping):
            raise ConfigError(f"Client {key!r}'s device is a {type(dev).__name__}, not a dict ({SHAPE}).")
        missing = [k for k in ("computation", "communication") if k not in dev]
        if missing:
            raise ConfigError(f"Client {key!r}'s device has no {' and no '.join(missing)} ({SHAPE}).")
        both = _value(dev, "communication", key, positive=True)
        down = _value(dev, "dl_kbps", key, positive=True) if "dl_kbps" in dev else both
        up = _value(dev, "ul_kbps", key, positive=True) if "ul_kbps" in dev else both
        rows.append(
            {
                "client": i,
                "seconds_per_sample": 3 * _value(dev, "computation", key, positive=False) / 1000,
                "down_mbps": down * BITS_PER_KBIT / 1e6,
                "up_mbps": up * BITS_PER_KBIT / 1e6,
            }
        )
    return rows


def write(rows: list[dict[str, Any]], out: str) -> None:
    write_trace_csv(out, FIELDS, ([row[f] for f in FIELDS] for row in rows), "devices.csv")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="fedscale_devices.py", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="FedScale's device pickle (e.g. client_device_capacity)")
    p.add_argument("out", help="the CSV to write")
    try:
        args = p.parse_args(argv)
        rows = convert(read_trace(args.trace))
        write(rows, args.out)
    except ConfigError as e:
        print(f"fedscale_devices.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows)} devices written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
