"""Surviving failures on real Ray actors: a client worker that dies (``ray.kill``) between or in the
middle of a round is replaced, its clients' state restored and the lost jobs retried, and the run
ends with the undisturbed run's metrics; a dead server actor ends the run with a clear message and
a checkpoint that resumes to the same metrics."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from raysim import checkpoint
from raysim.engine.runner import run_experiment
from raysim.errors import RunAborted
from raysim.results.output import BaseCallback
from tests.conftest import tiny_config, without_times
from tests.engine.test_checkpoint import CLI_ARGS, run_cli, wait_for_rows

#: Fed3+2p: phase 1 chains clients through Type-A coordinators across both workers (a chain's
#: segments pass weights worker to worker); phase 2 keeps each client's P-head and filter on its
#: home worker
SETUP: dict[str, Any] = {
    "algo": "fed3p2",
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "clients": 10,
    "rounds": 6,
    "participation": 0.8,
    "eval.every": 1,
    "train.local_epochs": 3,
    "algo.num_type_a": 3,
    "algo.num_type_b": 3,
    "train.lr": 0.01,
}


def gone(actor: Any) -> None:
    """Wait until ``actor`` is dead: ``ray.kill`` only asks for it, and a call sent at once may still
    be served (on a loaded machine, the next round's evaluation)."""
    import time

    import ray

    for _ in range(200):
        try:
            ray.get(actor.ping.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers after 10 s")


class Kill(BaseCallback):
    """``ray.kill`` an actor of the running executor when round ``rnd`` is logged: at once (it is
    gone when the next round starts) or, ``mid_round``, as soon as the next round has submitted its
    first call (a round now takes tens of milliseconds here, so no timer is sure to fall inside it)."""

    def __init__(self, executors: list[Any], rnd: int, which: str, mid_round: bool = False) -> None:
        self.executors, self.rnd, self.which, self.mid_round = executors, rnd, which, mid_round

    def on_round(self, stats: Any, round_time: float) -> None:
        import ray

        if stats.rnd != self.rnd:
            return
        ex = self.executors[-1]
        actor = ex.server if self.which == "server" else ex.workers[1]
        if not self.mid_round:
            ray.kill(actor)
            gone(actor)
            return
        submit = ex._submit

        def submit_then_kill(*args: Any, **kwargs: Any) -> Any:
            """The round's first call submitted, the actor is killed: its jobs are under way (or
            about to be sent to it), none of the round's results gathered yet."""
            out = submit(*args, **kwargs)
            del ex._submit  # once: the round's later calls find the executor's own method
            ray.kill(actor)
            return out

        ex._submit = submit_then_kill


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The serial run (serial and Ray runs are equal, tests/engine/test_determinism.py)."""
    return run_experiment(tiny_config(tmp_path_factory.mktemp("serial"), **SETUP))


@pytest.mark.ray
@pytest.mark.parametrize("when", ["between_rounds", "mid_round"])
def test_a_dead_client_worker_is_replaced_and_the_metrics_do_not_change(
    tmp_path, ray_local, executors, undisturbed, when
):
    cfg = tiny_config(tmp_path, **SETUP, **{"ray.executor": "ray", "ray.workers": 2})
    # round 2 is in phase 1 (chains across workers), round 4 in phase 2 (personal state on workers)
    kills = [Kill(executors, rnd, "worker", mid_round=when == "mid_round") for rnd in (2, 4)]
    result = run_experiment(cfg, kills)
    assert result.worker_restarts == 2
    assert without_times(result.rows) == without_times(undisturbed.rows)


@pytest.mark.ray
def test_a_dead_server_ends_the_run_with_a_checkpoint_that_resumes(
    tmp_path, ray_local, executors, undisturbed
):
    cfg = tiny_config(
        tmp_path, **SETUP, **{"ray.executor": "ray", "ray.workers": 2, "output.checkpoint_every": 0}
    )
    with pytest.raises(RunAborted) as info:
        run_experiment(cfg, [Kill(executors, 3, "server")])
    message = str(info.value)
    # killed before round 3 was evaluated: round 2 is the last completed one
    assert "server actor died" in message and "checkpoint of round 2" in message and "--resume" in message
    ckpt = checkpoint.load(tmp_path)
    assert ckpt.round == 2 and without_times(ckpt.rows) == without_times(undisturbed.rows[:2])
    resumed = run_experiment(cfg, resume=ckpt)
    assert without_times(resumed.rows) == without_times(undisturbed.rows)


@pytest.mark.ray
@pytest.mark.slow  # about 85 s of a two-node cluster; pytest -m slow runs it
def test_a_lost_node_ends_the_run_with_a_message_and_a_checkpoint_that_resumes(tmp_path):
    """A two-node cluster loses the node of one client worker: no replacement finds a place, the
    run ends (exit 1) saying so, with a checkpoint of the last completed round, and the run resumes
    on local Ray to the undisturbed metrics. (The server actor asks for no CPU, so Ray may have put
    it on the lost node: the run then ends saying the server died, with the same checkpoint.)"""
    from ray.cluster_utils import Cluster

    args = [*CLI_ARGS, "--local-epochs", "5", "--rounds", "60", "--checkpoint-every", "0"]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        run = run_cli(
            [*args, "--address", cluster.address, "--workers", "2", "--out", str(tmp_path / "run"),
             "--set", "ray.replace_timeout_s=5"],
            tmp_path,
        )  # fmt: skip
        wait_for_rows(tmp_path / "run" / "metrics.parquet", run, 2)
        cluster.remove_node(node)
        _, err = run.communicate(timeout=180)
    finally:
        cluster.shutdown()
    assert run.returncode == 1, err[-2000:]
    said = ("no replacement found a place in the cluster", "The server actor died")
    assert any(s in err for s in said) and "--resume" in err, err[-2000:]
    assert "Traceback" not in err
    stopped_at = checkpoint.load(tmp_path / "run").round
    assert 2 <= stopped_at < 60
    resumed = run_cli(
        ["--resume", str(tmp_path / "run"), "--address", "local", "--workers", "2", "--no-progress"], tmp_path
    )
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["rounds"] == 60
    serial = run_cli([*args, "--executor", "serial", "--out", str(tmp_path / "serial")], tmp_path)
    assert serial.wait(300) == 0
    a = pq.read_table(tmp_path / "serial" / "metrics.parquet").to_pylist()
    b = pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist()
    assert without_times(a) == without_times(b)
