"""Ray's and PyTorch's private internals behind one door (raysim/internals.py): the switch
``RAYSIM_INTERNALS`` refuses what it does not know, turning the internals off changes no number of
a run (serial or on Ray), and the versions they were checked on are pinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.errors import ConfigError
from raysim.internals import ENV, internals_on
from tests.conftest import tiny_config, without_times

ROOT = Path(__file__).resolve().parents[2]

#: the versions of Ray and PyTorch whose internals raysim's were last checked against
CHECKED = {"ray": "2.60.0", "torch": "2.14.1"}


@pytest.mark.parametrize("value", ["2", "of", "yes please", "O", "-1", "onn"])
def test_a_mistyped_switch_is_refused_in_one_sentence(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ConfigError) as e:
        internals_on()
    message = str(e.value)
    assert message.startswith(f"{ENV}={value!r} is not a switch") and message.count(". ") == 0 and message.endswith(".")


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("", True), ("1", True), ("ON", True), ("true", True), ("0", False), ("off", False), (" False ", False)]
)
def test_the_switch_reads_on_and_off(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert internals_on() is on


def test_a_mistyped_switch_stops_a_run_before_ray_starts(monkeypatch):
    from raysim.engine.executors import session

    monkeypatch.setenv(ENV, "nope")
    with pytest.raises(ConfigError, match="is not a switch"):
        session.start_ray(tiny_config())


@pytest.mark.parametrize("executor", ["serial", "ray"])
def test_a_mistyped_switch_stops_a_run_before_its_executor_asks_for_the_data(monkeypatch, executor):
    from raysim.engine.executors.ray_executor import RayExecutor
    from raysim.engine.executors.serial import SerialExecutor
    from raysim.engine.experiment import validate

    def load():
        raise AssertionError("the data was asked for")

    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ConfigError, match="is not a switch"):  # validation refuses it first
        validate(tiny_config(**{"ray.executor": executor}))
    monkeypatch.delenv(ENV)
    exp = validate(tiny_config(**{"ray.executor": executor}))
    monkeypatch.setenv(ENV, "yes")  # set after validation: the executor refuses it before the data
    with pytest.raises(ConfigError, match="is not a switch"):
        {"serial": SerialExecutor, "ray": RayExecutor}[executor].start(exp, load)


def test_a_joined_clusters_workers_get_the_switch_and_a_local_rays_inherit_it(monkeypatch):
    from raysim.engine.executors.session import worker_runtime_env

    monkeypatch.setenv(ENV, "0")
    assert (worker_runtime_env(joining=True) or {}).get("env_vars", {}).get(ENV) == "0"
    assert ENV not in (worker_runtime_env() or {}).get("env_vars", {})  # no runtime environment for it
    monkeypatch.delenv(ENV)
    assert ENV not in (worker_runtime_env(joining=True) or {}).get("env_vars", {})


def test_the_internals_were_checked_on_the_installed_versions():
    """An upgrade of Ray or PyTorch is a conscious step: check each use listed in the failure on the
    new version (and its fallback with RAYSIM_INTERNALS=0), then change the pins here and in the
    modules."""
    import ray
    import torch

    from raysim import torch_internals
    from raysim.engine.executors import ray_internals

    assert (ray_internals.CHECKED_ON, torch_internals.CHECKED_ON) == (CHECKED["ray"], CHECKED["torch"])
    installed = {"ray": ray.__version__, "torch": torch.__version__.split("+")[0]}
    uses = {"ray": ray_internals.USES, "torch": torch_internals.USES}
    where = {"ray": "raysim/engine/executors/ray_internals.py", "torch": "raysim/torch_internals.py"}
    for name, version in installed.items():
        if version != CHECKED[name]:
            pytest.fail(
                f"{name} {version} is installed, but raysim's uses of its internals were checked on "
                f"{CHECKED[name]}. Check again in {where[name]}, on {name} {version}:\n- "
                + "\n- ".join(uses[name])
                + f"\nthen set CHECKED_ON there and CHECKED[{name!r}] in tests/engine/test_internals.py to {version!r}."
            )


def test_a_layout_off_is_read_through_the_public_api_every_time(monkeypatch):
    """Off, no layout is kept and a part's tensors come from ``state_dict``: the same tensors in
    the same order as the layout read from the modules' own dicts, and the same values loaded."""
    import numpy as np
    import torch

    from raysim import models

    model = models.build_model("cnn3p2_fmnist", (1, 28, 28), 10, seed=1)
    monkeypatch.setenv(ENV, "1")
    on = {p: models.float_tensors(model.part(p)) for p in ("extractor", "filter", "head")}
    assert models.layout(model.extractor) is models.layout(model.extractor)  # kept
    monkeypatch.setenv(ENV, "0")
    assert models.layout(model.extractor) is not models.layout(model.extractor)  # read anew
    assert models.layout(model.extractor).floats is None
    off = {p: models.float_tensors(model.part(p)) for p in on}
    assert all(len(on[p]) == len(off[p]) and all(a is b for a, b in zip(on[p], off[p], strict=True)) for p in on)
    weights = models.get_weights(model, ("extractor", "head"))
    other = models.build_model("cnn3p2_fmnist", (1, 28, 28), 10, seed=2)
    loaded = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV, switch)
        target = models.build_model("cnn3p2_fmnist", (1, 28, 28), 10, seed=2)
        models.WeightsLoader().load(target, weights)
        loaded[switch] = models.get_weights(target, ("extractor", "head", "filter"))
    for part in ("extractor", "head", "filter"):
        assert np.array_equal(loaded["1"].part(part), loaded["0"].part(part))
    assert np.array_equal(loaded["0"].part("head"), weights.part("head"))
    assert np.array_equal(loaded["0"].part("filter"), models.get_part(other, "filter"))
    monkeypatch.setenv(ENV, "1")  # a registration after a layout was kept is seen
    kept = models.layout(model.head)
    model.head.register_buffer("extra", torch.zeros(1))
    assert models.layout(model.head) is not kept


def test_serial_runs_give_the_same_numbers_with_the_internals_off_and_on(tmp_path, monkeypatch):
    from raysim.engine.runner import run_experiment

    rows = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(ENV, switch)
        cfg = tiny_config(tmp_path / switch, algo="fedper", rounds=2)
        rows[switch] = without_times(run_experiment(cfg).rows)
    assert rows["0"] == rows["1"]


#: a run on a Ray of its own with the internals off, and what its workers read of the switch
OFF_ON_RAY = """
import json, sys
import ray
from raysim.engine.executors import ray_internals
from raysim.engine.runner import run_experiment
from raysim.results.output import BaseCallback
from tests.conftest import tiny_config, without_times

seen = {}

@ray.remote(num_cpus=0)
def read():
    import os
    from raysim import torch_internals
    from raysim.internals import internals_on
    return internals_on(), torch_internals.registrations(), os.nice(0)

class Seen(BaseCallback):
    def on_round(self, stats, round_time):
        if "workers" not in seen:
            seen["workers"] = ray.get(read.remote())
            seen["node"] = ray_internals.global_node() is not None

cfg = tiny_config(sys.argv[1], algo="fedper", rounds=2, **{"ray.executor": "ray", "ray.workers": 2, "ray.reuse_workers": False})
rows = without_times(run_experiment(cfg, [Seen()]).rows)
print(json.dumps({"rows": rows, "seen": seen, "initialized": ray.is_initialized()}))
"""


@pytest.mark.ray
@pytest.mark.integration
def test_ray_runs_give_the_same_numbers_with_the_internals_off_and_on(tmp_path, ray_local):
    """Off in a process that starts its own Ray (as a user's run does): its workers inherit the
    switch, Ray starts with its own settings and stops without Ray's internals, and the run's
    numbers are those of a serial run and of a Ray run with them on (the session's Ray, started
    through them)."""
    from raysim.engine.executors.ray_internals import SYSTEM_CONFIG
    from raysim.engine.runner import run_experiment

    # (Ray's own settings as the session's Ray was given them are left out: off, raysim sets none)
    env = {**{k: v for k, v in os.environ.items() if k not in SYSTEM_CONFIG}, ENV: "0"}
    proc = subprocess.run(
        [sys.executable, "-c", OFF_ON_RAY, str(tmp_path / "off")], capture_output=True, text=True, timeout=400, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr
    off = json.loads(proc.stdout.strip().splitlines()[-1])
    # the workers read the switch off, and run at Ray's own niceness (15), not raysim's (0)
    assert off["seen"] == {"workers": [False, None, 15], "node": False} and off["initialized"] is False, off
    on_ray = {"algo": "fedper", "rounds": 2, "ray.executor": "ray", "ray.workers": 2}
    on = without_times(run_experiment(tiny_config(tmp_path / "on", **on_ray)).rows)
    serial = without_times(run_experiment(tiny_config(tmp_path / "serial", algo="fedper", rounds=2)).rows)
    assert json.loads(json.dumps(on)) == off["rows"] == json.loads(json.dumps(serial))


def test_batch_norm_layers_are_found_alike_off_and_on(monkeypatch):
    from torch import nn

    from raysim import models, torch_internals

    found = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV, switch)
        found[switch] = [
            [torch_internals.is_batch_norm(m) for m in models.build_model(name, (3, 32, 32), 10, seed=0).modules()]
            for name in ("mobilenet", "cnn3p2_cifar")
        ]
        assert torch_internals.is_batch_norm(nn.SyncBatchNorm(4)) and not torch_internals.is_batch_norm(nn.LayerNorm(4))
    assert found["1"] == found["0"] and any(found["1"][0]) and not any(found["1"][1])
