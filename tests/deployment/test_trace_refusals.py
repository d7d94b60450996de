"""Trace files a user gets wrong are refused in one sentence when the driver checks the deployment,
before Ray starts or the data loads (raysim.deployment.traces): a device trace with both a
``seconds_per_sample`` and a ``speed`` column, a column name raysim does not read (a typo, another
unit, another case), a speed or bandwidth that is not above 0, NaN, a line of the wrong length, a
client twice, a file that is not a comma-separated text file. ``scripts/fedscale_devices.py``
refuses what it cannot convert the same way: one sentence on stderr, exit status 2, no file
written."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.api import checked_experiment
from raysim.errors import ConfigError
from tests.engine.test_refusals import assert_refused

ROOT = Path(__file__).resolve().parents[2]
CONVERTER = ROOT / "scripts" / "fedscale_devices.py"
BASE = {"data.dataset": "synthetic", "model": "mlp_fcd", "clients": 8, "ray.executor": "serial"}

DEVICES = [
    (
        "client,seconds_per_sample,speed,down_mbps,up_mbps\n0,0.002,2,8,2\n",
        "has both a seconds_per_sample and a speed column; give a device's compute in one of them",
    ),
    (
        "client,seconds_per_samples,down_mbps,up_mbps\n0,0.002,8,2\n",
        "has a column 'seconds_per_samples' (did you mean seconds_per_sample, in seconds?), which raysim does not read",
    ),
    (
        "client,speed,down_mbps,up_mbps,latency\n0,2,8,2,0.1\n",
        "a column 'latency' (did you mean latency_s, in seconds?)",
    ),
    (
        "client,speed,down_kbps,up_kbps\n0,2,8000,2000\n",
        "a column 'down_kbps' (did you mean down_mbps, in megabits a second?)",
    ),
    ("Client,Speed,Down_Mbps,Up_Mbps\n0,2,8,2\n", "a column 'Client' (did you mean client?)"),
    (
        "client,speed,down_mbps,up_mbps,memory_gb\n0,2,8,2,4\n",
        "a column 'memory_gb', which raysim does not read; its columns",
    ),
    (
        "client,speed,down_mbps,up_mbps\n0,-2,8,2\n",
        "Line 2 of {f}: speed must be a finite number above 0, not -2.",
    ),
    (
        "client,speed,down_mbps,up_mbps\n0,0,8,2\n",
        "Line 2 of {f}: speed must be a finite number above 0, not 0.",
    ),
    (
        "client,speed,down_mbps,up_mbps\n0,2,8,2\n1,nan,8,2\n",
        "Line 3 of {f}: speed must be a finite number above 0, not nan.",
    ),
    ("client,speed,down_mbps,up_mbps\n0,inf,8,2\n", "speed must be a finite number above 0, not inf."),
    ("client,speed,down_mbps,up_mbps\n0,,8,2\n", "Line 2 of {f}: speed is not a number ('')."),
    (
        "client,seconds_per_sample,down_mbps,up_mbps\n0,NaN,8,2\n",
        "seconds_per_sample must be a finite number at least 0, not nan.",
    ),
    (
        "client,seconds_per_sample,down_mbps,up_mbps\n0,-0.1,8,2\n",
        "seconds_per_sample must be a finite number at least 0",
    ),
    ("client,speed,down_mbps,up_mbps\n0,2,0,2\n", "down_mbps must be a finite number above 0, not 0."),
    (
        "client,speed,down_mbps,up_mbps,latency_s\n0,2,8,2,-1\n",
        "latency_s must be a finite number at least 0, not -1.",
    ),
    (
        "client;speed;down_mbps;up_mbps\n0;2;8;2\n",
        "is not comma-separated: its header is 'client;speed;down_mbps;up_mbps'",
    ),
    ("client\tspeed\tdown_mbps\tup_mbps\n0\t2\t8\t2\n", "is not comma-separated"),
    (
        "client,speed,down_mbps,up_mbps\n0,2,8\n",
        "Line 2 of {f} has 3 fields, not the 4 of its header's columns.",
    ),
    (
        "client,speed,down_mbps,up_mbps\n0,2,8,2,1\n",
        "Line 2 of {f} has 5 fields, not the 4 of its header's columns.",
    ),
    (
        "client,speed,down_mbps,up_mbps\n0,2,8,2\n\n0,3,8,2\n",
        "Lines 2 and 4 of {f} both give client 0's device.",
    ),
    ("client,speed,down_mbps,up_mbps\n0.5,2,8,2\n", "client must be a whole number (a client id), not 0.5."),
    ("client,speed,speed,down_mbps,up_mbps\n0,2,2,8,2\n", "has the column speed twice."),
    (
        "client,speed,down_mbps,up_mbps,\n0,2,8,2,\n",
        "Column 5 of the device trace {f} has no name in its header.",
    ),
    ("client,down_mbps,up_mbps\n0,8,2\n", "gives neither seconds_per_sample nor speed"),
    ("client,speed,down_mbps\n0,2,8\n", "lacks the column(s) up_mbps."),
    ("client,speed,down_mbps,up_mbps\n", "has no rows."),
    ("", "lacks the column(s) client, down_mbps, up_mbps."),
]

AVAILABILITY = [
    ("client,start,end\n0,0,10\n", "a column 'start' (did you mean start_s, in seconds?)"),
    ("client,start_s,end_ms\n0,0,10000\n", "a column 'end_ms' (did you mean end_s, in seconds?)"),
    ("client,start_s,end_s,duration_s\n0,0,10,10\n", "a column 'duration_s', which raysim does not read"),
    ("client,start_s,end_s\n0,-5,10\n", "start_s must be a finite number at least 0, not -5."),
    ("client,start_s,end_s\n0,0,nan\n", "end_s must be a finite number at least 0, not nan."),
    ("client,start_s,end_s\n0,10,5\n", "end_s (5) must be after start_s (10)."),
    ("client,start_s,end_s\nfirst,0,10\n", "client is not a number ('first')."),
    ("client\tstart_s\tend_s\n0\t0\t10\n", "is not comma-separated"),
]


def refusal(kind: str, path: Path | str) -> str:
    """The sentence the real check (raysim.engine.experiment.validate) refuses the trace with."""
    with pytest.raises(ConfigError) as e:
        checked_experiment(
            None, set={**BASE, f"deployment.{kind}": "trace", f"deployment.{kind}_file": str(path)}
        )
    sentence = str(e.value)
    assert "\n" not in sentence and sentence.endswith("."), sentence
    return sentence


@pytest.mark.parametrize(("text", "needle"), DEVICES, ids=[n[:40] for _, n in DEVICES])
def test_a_bad_device_trace_is_refused(text, needle, tmp_path):
    f = tmp_path / "devices.csv"
    f.write_text(text)
    assert needle.replace("{f}", str(f)) in refusal("devices", f)


@pytest.mark.parametrize(("text", "needle"), AVAILABILITY, ids=[n[:40] for _, n in AVAILABILITY])
def test_a_bad_availability_trace_is_refused(text, needle, tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text(text)
    assert needle.replace("{f}", str(f)) in refusal("availability", f)


def test_a_fedscale_pickle_given_as_the_device_trace_is_refused_with_the_converter_named(tmp_path):
    f = tmp_path / "client_device_capacity"
    f.write_bytes(pickle.dumps({1: {"computation": 10.0, "communication": 100.0}}))
    assert refusal("devices", f) == (
        f"The device trace {f} is not a CSV text file; a FedScale device pickle converts with "
        "scripts/fedscale_devices.py."
    )


def test_a_trace_that_is_missing_or_a_directory_is_refused(tmp_path):
    assert (
        refusal("devices", tmp_path / "nosuch.csv")
        == f"The device trace {tmp_path / 'nosuch.csv'} does not exist."
    )
    assert (
        refusal("availability", tmp_path)
        == f"The availability trace {tmp_path} is a directory, not a CSV file."
    )


def test_spaces_around_the_column_names_and_a_byte_order_mark_are_read(tmp_path):
    from raysim.deployment.clock import Device
    from raysim.deployment.traces import MEGABIT, read_devices

    f = tmp_path / "devices.csv"
    f.write_bytes("\ufeffclient, speed , down_mbps, up_mbps\n0, 2, 8, 2\n".encode())
    assert read_devices(str(f), Device(0.001, latency_s=0.05)) == (
        Device(0.002, 8 * MEGABIT, 2 * MEGABIT, 0.05),
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "client,seconds_per_sample,speed,down_mbps,up_mbps\n0,0.002,2,8,2\n",
            "has both a seconds_per_sample and a speed",
        ),
        ("client,speed,down_mbps,up_mbps\n0,0,8,2\n", "speed must be a finite number above 0, not 0."),
    ],
)
def test_the_command_refuses_a_bad_trace_before_ray_or_data(text, needle, tmp_path):
    f = tmp_path / "devices.csv"
    f.write_text(text)
    args = ["--dataset", "synthetic", "--clients", "4", "--set", "deployment.devices=trace"]
    assert_refused([*args, "--set", f"deployment.devices_file={f}"], needle, tmp_path)


# ---- scripts/fedscale_devices.py


def fedscale(tmp: Path) -> dict[str, Path]:
    """FedScale device traces a user could hand the converter by mistake."""
    files: dict[str, bytes] = {
        "devices.csv": b"client,seconds_per_sample,down_mbps,up_mbps\n0,0.03,8,2\n",
        "garbage.bin": bytes(range(256)),
        "list.pkl": pickle.dumps([10.0, 100.0]),
        "empty.pkl": pickle.dumps({}),
        "flat.pkl": pickle.dumps({1: 10.0}),
        "nocomm.pkl": pickle.dumps({1: {"computation": 10.0}}),
        "text.pkl": pickle.dumps({1: {"computation": "fast", "communication": 100.0}}),
        "zero.pkl": pickle.dumps({1: {"computation": 10.0, "communication": 0.0}}),
        "nan.pkl": pickle.dumps({1: {"computation": float("nan"), "communication": 100.0}}),
        "mixed.pkl": pickle.dumps(
            {1: {"computation": 1.0, "communication": 2.0}, "a": {"computation": 1.0, "communication": 2.0}}
        ),
        "ok.pkl": pickle.dumps({1: {"computation": 10.0, "communication": 100.0}}),
    }
    files["cut.pkl"] = pickle.dumps({i: {"computation": 1.0, "communication": 2.0} for i in range(50)})[:60]
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    (tmp / "folder").mkdir()
    return {name: tmp / name for name in [*files, "folder"]}


SHAPE = "FedScale's device trace is a pickle of {client_id: {'computation': ms, 'communication': kbps}}"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["missing.pkl", "out.csv"], "The FedScale device trace {tmp}/missing.pkl does not exist."),
        (["folder", "out.csv"], "The FedScale device trace {tmp}/folder is a directory, not a file"),
        (["devices.csv", "out.csv"], "{tmp}/devices.csv is a text file, not a pickle: " + SHAPE),
        (["garbage.bin", "out.csv"], "{tmp}/garbage.bin is not a pickle (UnpicklingError: "),
        (
            ["cut.pkl", "out.csv"],
            "{tmp}/cut.pkl is not a pickle (UnpicklingError: pickle data was truncated); " + SHAPE,
        ),
        (["list.pkl", "out.csv"], "{tmp}/list.pkl holds a list, not FedScale's device trace"),
        (["empty.pkl", "out.csv"], "{tmp}/empty.pkl holds no client devices."),
        (["flat.pkl", "out.csv"], "Client 1's device is a float, not a dict"),
        (["nocomm.pkl", "out.csv"], "Client 1's device has no communication"),
        (["text.pkl", "out.csv"], "Client 1's computation is not a number ('fast')."),
        (["zero.pkl", "out.csv"], "Client 1's communication must be a number above 0, not 0."),
        (["nan.pkl", "out.csv"], "Client 1's computation must be a number at least 0, not nan."),
        (["mixed.pkl", "out.csv"], "client ids are of mixed kinds"),
        (["ok.pkl", "folder"], "{tmp}/folder is a directory; name the CSV to write"),
        (["ok.pkl", "nowhere/out.csv"], "{tmp}/nowhere/out.csv: the folder {tmp}/nowhere does not exist."),
        (["ok.pkl"], "The following arguments are required: out."),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_the_fedscale_converter_refuses_in_one_sentence(args, needle, tmp_path):
    fedscale(tmp_path)
    paths = [str(tmp_path / a) for a in args]
    proc = subprocess.run(
        [sys.executable, str(CONVERTER), *paths], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("fedscale_devices.py: error: ") and lines[0].endswith(".")
    ), lines
    assert needle.replace("{tmp}", str(tmp_path)) in lines[0], lines[0]
    assert not (tmp_path / "out.csv").exists()


def test_the_fedscale_converter_writes_a_trace_raysim_reads(tmp_path):
    files = fedscale(tmp_path)
    out = tmp_path / "out.csv"
    proc = subprocess.run(
        [sys.executable, str(CONVERTER), str(files["ok.pkl"]), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"1 devices written to {out}", proc.stderr
    cfg = checked_experiment(
        None, set={**BASE, "deployment.devices": "trace", "deployment.devices_file": str(out)}
    ).cfg
    assert cfg.deployment.devices_file == str(out)
