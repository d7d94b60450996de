"""Callbacks that act: a callback's hook may reply metrics (joined to the round's row, so to
metrics.parquet and TensorBoard) and ask the run to stop (it ends after that round, its summary
written); a plugin registers callbacks a config names; the target can stop a run."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import raysim
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.plugins import CALLBACKS, register_callback
from raysim.results.output import BaseCallback, Reply
from tests.conftest import tiny_config

#: a few seconds on synthetic data, serial, no progress bar
TINY = dict(
    dataset="synthetic", model="mlp_fcd", clients=6, participation=0.5, rounds=5, local_epochs=1,
    batch_size=20, lr=0.05, partition="dirichlet:0.5", executor="serial", progress=False, tensorboard=True,
    set={"data.synthetic.train_samples": 600, "data.synthetic.test_samples": 300, "data.synthetic.shape": (1, 8, 8),
         "eval.every": 1},
)  # fmt: skip


class HalfLoss(BaseCallback):
    """Adds ``half_loss`` (half the round's training loss) to every evaluated row, and stops the run
    after round ``stop_at``."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.seen: list[int] = []

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Reply:
        self.seen.append(rnd)
        return Reply(metrics={"half_loss": row["train_loss"] / 2}, stop=rnd == self.stop_at)


class Sees(BaseCallback):
    """What a callback told after another sees: the rows (with the metrics replied before it)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> None:
        self.rows.append(dict(row))


def test_a_callback_adds_a_metric_and_stops_the_run(tmp_path):
    stopper, sees = HalfLoss(stop_at=3), Sees()
    result = raysim.run(**TINY, out=str(tmp_path), callbacks=[stopper, sees])
    assert stopper.seen == [1, 2, 3], "the run ended after the round whose callback asked it to"
    assert list(result.metrics["round"]) == [1, 2, 3]
    assert np.allclose(result.metrics["half_loss"], result.metrics["train_loss"] / 2)
    assert [r["half_loss"] for r in sees.rows] == list(result.metrics["half_loss"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["stopped"] is False  # a clean end, not a Ctrl-C
    assert summary["final"]["gm_gtest"] == result.metrics["gm_gtest"].iloc[-1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("accuracy/gm_gtest")] == [1, 2, 3]


class Bad(BaseCallback):
    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def on_eval(self, rnd: int, row: dict[str, Any], clients: list[dict[str, Any]]) -> Any:
        return self.reply


@pytest.mark.parametrize(
    "reply, needle",
    [
        (True, r"Bad's on_eval returned True; a hook returns None or a raysim.results.output.Reply\.$"),
        (Reply(metrics={"round": 9}), r"replied a metric 'round' that is already there\.$"),
        (Reply(metrics={"": 1.0}), r"replied a metric '' that is not a name\.$"),
    ],
)
def test_a_reply_that_cannot_be_is_refused_in_one_sentence(tmp_path, reply, needle):
    with pytest.raises(ConfigError, match=needle):
        run_experiment(tiny_config(tmp_path, rounds=1), [Bad(reply)])


def test_a_callback_without_every_hook_is_refused_before_any_work(tmp_path):
    class Watcher:  # the four hooks of before, without on_image
        def on_start(self, cfg, run_dir): ...  # type: ignore[no-untyped-def]
        def on_round(self, stats, round_time): ...  # type: ignore[no-untyped-def]
        def on_eval(self, rnd, row, clients): ...  # type: ignore[no-untyped-def]
        def on_end(self, summary): ...  # type: ignore[no-untyped-def]

    with pytest.raises(ConfigError, match=r"Watcher has no on_image hook; derive it from .*BaseCallback"):
        run_experiment(tiny_config(tmp_path / "run", rounds=1), [Watcher()])  # type: ignore[list-item]
    assert not (tmp_path / "run" / "metrics.parquet").exists()


class Picture(BaseCallback):
    """Makes a picture at round 1; a later callback takes it through on_image."""

    def on_round(self, stats: Any, round_time: float) -> Reply | None:
        return Reply(images={"mine/square": np.full((4, 4), 200, np.uint8)}) if stats.rnd == 1 else None


class Takes(BaseCallback):
    def __init__(self) -> None:
        self.images: list[tuple[str, tuple[int, ...], int]] = []

    def on_image(self, tag: str, image: np.ndarray, rnd: int) -> None:
        self.images.append((tag, image.shape, rnd))


def test_a_picture_a_callback_makes_goes_to_every_callbacks_on_image_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    takes = Takes()
    run_experiment(tiny_config(tmp_path, rounds=2, **{"output.tensorboard": True}), [Picture(), takes])
    assert takes.images == [("mine/square", (4, 4), 1)]
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Images("mine/square")] == [1]


@register_callback("test_round_counter")
class RoundCounter(BaseCallback):
    """A plugin's callback: the rounds so far, as a metric."""

    def __init__(self, cfg: Any) -> None:
        self.rounds = 0

    def on_round(self, stats: Any, round_time: float) -> Reply:
        self.rounds += 1
        return Reply(metrics={"rounds_seen": self.rounds})


def test_a_plugins_callback_is_named_by_the_config(tmp_path):
    assert "test_round_counter" in CALLBACKS
    result = raysim.run(**{**TINY, "set": {**TINY["set"], "output.callbacks": "test_round_counter"}}, out=str(tmp_path))
    assert list(result.metrics["rounds_seen"]) == [1, 2, 3, 4, 5]
    assert result.config["plugins"], "the module that registered it is a plugin of the run"


@pytest.mark.parametrize(
    "value, needle",
    [
        ("nope", r"^Unknown callback 'nope' \(known: .*test_round_counter"),
        ("test_round_counter,,x", r"output.callbacks has an empty item"),
        ("test_round_counter,test_round_counter", r"output.callbacks names 'test_round_counter' twice"),
    ],
)
def test_a_callback_name_that_cannot_be_is_refused(tmp_path, value, needle):
    with pytest.raises(ConfigError, match=needle):
        raysim.run(**{**TINY, "set": {**TINY["set"], "output.callbacks": value}}, out=str(tmp_path))
    assert not (tmp_path / "metrics.parquet").exists()


def test_the_target_stops_the_run_with_stop_at_target(tmp_path):
    full = run_experiment(tiny_config(tmp_path / "full", rounds=5, **{"eval.every": 1}))
    target = full.rows[1]["gm_gtest"]  # reached at round 2 at the latest
    reached = next(r["round"] for r in full.rows if r["gm_gtest"] >= target)
    stopped = run_experiment(
        tiny_config(tmp_path / "stop", rounds=5, **{"eval.every": 1, "eval.target": target, "eval.stop_at_target": True})
    )
    assert stopped.last_round == reached and not stopped.stopped
    summary = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert summary["rounds_to_target"] == reached and summary["rounds"] == reached
    assert len(pq.read_table(tmp_path / "stop" / "metrics.parquet")) == reached


@pytest.mark.parametrize("value", ["maybe", "2", "[]"])
def test_stop_at_target_takes_true_or_false_and_a_target(tmp_path, value):
    with pytest.raises(ConfigError, match=r"eval.stop_at_target must be true or false"):
        raysim.make_config(**{**TINY, "set": {**TINY["set"], "eval.stop_at_target": value}})
    with pytest.raises(ConfigError, match=r"^eval.stop_at_target stops a run at eval.target, which is not set"):
        raysim.make_config(**{**TINY, "set": {**TINY["set"], "eval.stop_at_target": True}})
