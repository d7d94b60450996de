"""The FedScale trace converters: ``scripts/fedscale_availability.py`` turns FedScale's availability
("behaviour") pickle into raysim's availability CSV, read back by
:class:`raysim.deployment.traces.AvailabilityTrace` and online when FedScale's ``is_active`` rule says
so, periodic over FedScale's ``finish_time``; what it cannot convert ends in one sentence and exit
status 2. ``scripts/fedscale_devices.py`` reads FedScale's kilobit as 1,024 bits."""

from __future__ import annotations

import csv
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.deployment.clock import Device
from raysim.deployment.traces import MEGABIT, AvailabilityTrace, read_devices

ROOT = Path(__file__).resolve().parents[2]
AVAILABILITY = ROOT / "scripts" / "fedscale_availability.py"
DEVICES = ROOT / "scripts" / "fedscale_devices.py"


def convert(script: Path, trace: object, tmp: Path, *more: str) -> tuple[subprocess.CompletedProcess, Path]:
    src, out = tmp / "trace.pkl", tmp / "out.csv"
    src.write_bytes(pickle.dumps(trace))
    proc = subprocess.run(
        [sys.executable, str(script), str(src), str(out), *more], capture_output=True, text=True, timeout=60
    )
    return proc, out


def rows(out: Path) -> list[list[str]]:
    with open(out, newline="") as f:
        return list(csv.reader(f))


def fedscale_active(entry: dict, t: float) -> bool:
    """FedScale's rule (ClientMetadata.is_active): online where ``t mod finish_time`` lies in some
    ``[active[i], inactive[i]]``, read without the method's cursor."""
    norm = t % entry["finish_time"]
    return any(a <= norm <= b for a, b in zip(entry["active"], entry["inactive"], strict=True))


# ---- scripts/fedscale_availability.py

HAND = {
    7: {"active": [10], "inactive": [100], "finish_time": 100, "duration": 90, "model": "x"},
    3: {"active": [0, 50], "inactive": [20, 80], "finish_time": 100},
    5: {"active": [], "inactive": [], "finish_time": 100},
}


def test_a_hand_made_behaviour_trace_converts_to_exact_rows_raysim_reads(tmp_path):
    proc, out = convert(AVAILABILITY, HAND, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"3 online intervals of 2 clients written to {out} (period 100 s)"
    # client 5 has no interval: left out, said in one sentence on stderr
    assert proc.stderr.strip() == (
        "fedscale_availability.py: note: 1 client with no online interval (5) was left out, "
        "so raysim numbers the rest (2) from 0."
    )
    # clients by id: FedScale's 3 is raysim's 0, its 7 raysim's 1
    assert rows(out) == [
        ["client", "start_s", "end_s"],
        ["0", "0", "20"],
        ["0", "50", "80"],
        ["1", "10", "100"],
    ]
    trace = AvailabilityTrace.read(str(out))
    assert trace.span_s == 100
    # inside and between intervals, and past finish_time (the trace repeats every 100 s)
    for t in (5, 19.5, 25, 60, 85, 99.5, 105, 130, 160, 215, 1234.5, 10_070):
        for client, fedscale_id in enumerate((3, 7)):
            assert trace.online(client, t) == fedscale_active(HAND[fedscale_id], t), (client, t)
    assert (
        trace.online(0, 105)
        and not trace.online(0, 125)
        and trace.online(1, 199)
        and not trace.online(1, 205)
    )


def test_an_interval_of_no_length_is_left_out(tmp_path):
    """FedScale's own test data pairs active 1 with inactive 1: an instant online, in which no work
    fits, and which raysim's trace cannot hold."""
    trace = {0: {"active": [1, 3, 6, 9], "inactive": [1, 4, 7, 10], "finish_time": 12}}
    proc, out = convert(AVAILABILITY, trace, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rows(out)[1:] == [["0", "3", "4"], ["0", "6", "7"], ["0", "9", "10"]]


def test_clients_with_different_finish_times_repeat_over_the_longest(tmp_path):
    trace = {
        1: {"active": [0], "inactive": [10], "finish_time": 40},
        2: {"active": [5.5, 70], "inactive": [30.25, 100], "finish_time": 100},
        3: {"active": [1], "inactive": [2], "finish_time": 50},
    }
    proc, out = convert(AVAILABILITY, trace, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # 50 s divides 100 s, 40 s does not: said in one sentence
    assert proc.stderr.strip().splitlines() == [
        "fedscale_availability.py: note: The finish_time of client 1 (40 s) does not divide the longest "
        "(100 s), so raysim restarts it every 100 s where FedScale repeats each client over its own."
    ]
    assert rows(out)[1:] == [
        ["0", "0", "10"],
        ["0", "40", "50"],
        ["0", "80", "90"],
        ["1", "5.5", "30.25"],
        ["1", "70", "100"],
        ["2", "1", "2"],
        ["2", "51", "52"],
    ]
    read = AvailabilityTrace.read(str(out))
    # exact over the longest finish time (the first period), half-seconds off the intervals' ends
    for t in [i + 0.5 for i in range(100)]:
        got = [read.online(c, t) for c in (0, 1, 2)]
        assert got == [fedscale_active(trace[k], t) for k in (1, 2, 3)], t
    # and after it for the clients whose finish time divides it
    for t in (101.5, 151.5, 175, 1051.25):
        assert [read.online(c, t) for c in (1, 2)] == [fedscale_active(trace[k], t) for k in (2, 3)], t


def test_a_period_longer_than_the_latest_interval_is_said_and_kept_on_request(tmp_path):
    trace = {1: {"active": [0, 30], "inactive": [10, 50], "finish_time": 80}}
    proc, out = convert(AVAILABILITY, trace, tmp_path)
    assert proc.returncode == 0 and rows(out)[1:] == [["0", "0", "10"], ["0", "30", "50"]]
    note = proc.stderr.strip().splitlines()
    assert note == [
        "fedscale_availability.py: note: FedScale repeats this trace every 80 s but raysim repeats the CSV "
        "over its latest end_s (50 s), as no client is online at 80 s; --keep-period shifts the intervals "
        "30 s later to keep FedScale's period."
    ]
    assert AvailabilityTrace.read(str(out)).span_s == 50

    proc, out = convert(AVAILABILITY, trace, tmp_path, "--keep-period")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert rows(out)[1:] == [["0", "30", "40"], ["0", "60", "80"]]
    kept = AvailabilityTrace.read(str(out))
    assert kept.span_s == 80
    # FedScale's second t is raysim's t + 30, in every period
    for t in (5, 15, 35, 55, 85, 95, 115, 245, 1000.5):
        assert kept.online(0, t + 30) == fedscale_active(trace[1], t), t


def test_client_ids_are_whole_numbers_ordered_as_numbers(tmp_path):
    entry = {"active": [0], "inactive": [1], "finish_time": 1}
    late = {"active": [0.5], "inactive": [1], "finish_time": 1}
    proc, out = convert(AVAILABILITY, {"10": entry, 2.0: late}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rows(out)[1:] == [["0", "0.5", "1"], ["1", "0", "1"]]


BAD = [
    ({1: {"active": [0, 20], "inactive": [10, 15], "finish_time": 30}}, "Client 1's interval 1 ends at 15 s"),
    ({1: {"active": [5], "inactive": [2], "finish_time": 30}}, "before it starts at 5 s (active[0])."),
    (
        {1: {"active": [0, 20], "inactive": [10], "finish_time": 30}},
        "Client 1 has 2 active times but 1 inactive times; FedScale pairs them",
    ),
    (
        {1: {"active": ["0"], "inactive": [10], "finish_time": 30}},
        "Client 1's active[0] is not a number ('0').",
    ),
    (
        {1: {"active": [0], "inactive": [None], "finish_time": 30}},
        "Client 1's inactive[0] is not a number (None).",
    ),
    ({1: {"active": [0], "inactive": [10], "finish_time": "week"}}, "Client 1's finish_time is not a number"),
    (
        {1: {"active": [0], "inactive": [10], "finish_time": float("nan")}},
        "must be a finite number above 0, not nan.",
    ),
    (
        {1: {"active": [-5], "inactive": [10], "finish_time": 30}},
        "active[0] must be a finite number at least 0, not -5.",
    ),
    (
        {1: {"active": [0], "inactive": [40], "finish_time": 30}},
        "Client 1's finish_time (30 s) is before its latest inactive time (40 s)",
    ),
    ({1.5: {"active": [0], "inactive": [10], "finish_time": 30}}, "The client id 1.5 is not a whole number"),
    (
        {"phone": {"active": [0], "inactive": [10], "finish_time": 30}},
        "The client id 'phone' is not a whole number",
    ),
    (
        {
            1: {"active": [0], "inactive": [10], "finish_time": 30},
            "1": {"active": [0], "inactive": [10], "finish_time": 30},
        },
        "The client ids 1 and '1' are the same number, 1.",
    ),
    (
        {1: {"active": [], "inactive": [], "finish_time": 30}},
        "No client of the trace's 1 has an online interval",
    ),
    (
        {1: {"active": 0, "inactive": 10, "finish_time": 30}},
        "Client 1's active is an int, not a list of seconds",
    ),
    ({1: {"active": [0], "inactive": [10]}}, "Client 1's entry has no finish_time"),
    ({1: [0, 10]}, "Client 1's entry is a list, not a dict"),
    ([{"active": [0]}], "holds a list, not FedScale's availability trace"),
    ({}, "holds no clients."),
]


@pytest.mark.parametrize(("trace", "needle"), BAD, ids=[needle[:40] for _, needle in BAD])
def test_the_availability_converter_refuses_in_one_sentence(trace, needle, tmp_path):
    proc, out = convert(AVAILABILITY, trace, tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("fedscale_availability.py: error: ")
        and lines[0].endswith(".")
    )
    assert needle in lines[0], lines[0]
    assert not out.exists()


def test_a_text_file_or_a_missing_one_is_refused_in_one_sentence(tmp_path):
    csv_file = tmp_path / "availability.csv"
    csv_file.write_text("client,start_s,end_s\n0,0,10\n")
    for args, needle in [
        ([csv_file, tmp_path / "out.csv"], f"{csv_file} is a text file, not a pickle"),
        ([tmp_path / "missing.pkl", tmp_path / "out.csv"], "does not exist."),
        ([csv_file], "The following arguments are required: out."),
    ]:
        proc = subprocess.run(
            [sys.executable, str(AVAILABILITY), *map(str, args)], capture_output=True, text=True, timeout=60
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "out.csv").exists()


# ---- scripts/fedscale_devices.py


def test_fedscale_kilobits_are_1024_bits(tmp_path):
    proc, out = convert(DEVICES, {4: {"computation": 20.0, "communication": 1000.0}}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rows(out) == [
        ["client", "seconds_per_sample", "down_mbps", "up_mbps"],
        ["0", "0.06", "1.024", "1.024"],
    ]
    (device,) = read_devices(str(out), Device(latency_s=0.0))
    assert device == Device(pytest.approx(0.06), 1.024 * MEGABIT, 1.024 * MEGABIT, 0.0)
