"""The client-side helpers on ClientContext: what a client keeps, fresh parts, and the
named random streams that number a client's passes over its data."""

from __future__ import annotations

import numpy as np

from raysim.engine.executors.serial import SerialExecutor
from raysim.engine.runner import prepare
from raysim.toolkit.context import ClientContext, shuffle_purpose
from raysim.weights import ModelWeights
from tests.conftest import tiny_config


def _runtime(tmp_path):
    cfg = tiny_config(tmp_path)
    return SerialExecutor(cfg, prepare(cfg)).runtime


def test_kept_parts_fall_back_to_the_initial_or_a_fresh_part_and_keep_merges(tmp_path):
    rt = _runtime(tmp_path)
    ctx = ClientContext(rt, 3, 1)
    assert ctx.kept(("head",)).equals(rt.initial_weights.select(("head",)))
    fresh = ctx.kept(("phead",), fresh="test/phead")
    assert fresh.equals(ModelWeights(phead=rt.fresh_part("phead", "test/phead/3")))
    assert not fresh.equals(rt.initial_weights.select(("phead",)))
    assert not fresh.equals(ClientContext(rt, 4, 1).kept(("phead",), fresh="test/phead"))  # per client
    head = ModelWeights(head=np.full_like(rt.initial_weights.head, 0.5))
    ctx.keep(head)
    ctx.keep(fresh)
    later = ClientContext(rt, 3, 2)  # the next round's context sees what was kept
    assert later.kept(("head", "phead")).equals(head.merged(fresh))
    assert ClientContext(rt, 2, 2).kept(("head",)).equals(rt.initial_weights.select(("head",)))
    assert later.stored("control") is None and later.stored("control", 7) == 7
    later.store("control", head)
    assert ClientContext(rt, 3, 3).stored("control") is head
    assert rt.kept(3).equals(head.merged(fresh))  # stored values leave the kept parts alone


def test_each_train_call_draws_the_next_epochs_of_its_stream(tmp_path):
    rt = _runtime(tmp_path)
    ctx = ClientContext(rt, 0, 1)
    drawn: list[tuple[str, int]] = []
    real = ctx.batches

    def batches(epoch, stream="local"):
        drawn.append((stream, epoch))
        return real(epoch, stream)

    ctx.batches = batches  # type: ignore[method-assign]
    ctx.train(("head",), 0.1, epochs=2)
    ctx.train(("extractor",), 0.1, epochs=1)
    ctx.train(("head",), 0.1, epochs=1, advance=False)
    ctx.train(("head",), 0.1, epochs=1)
    ctx.train(("head",), 0.1, epochs=2, stream="finetune")
    assert drawn == [
        ("local", 0),
        ("local", 1),
        ("local", 2),
        ("local", 3),  # advance=False: the next call trains on the same shuffle
        ("local", 3),
        ("finetune", 0),
        ("finetune", 1),
    ]
    assert ClientContext(rt, 0, 2)._cursor == {}  # a new job starts every stream at epoch 0


def test_streams_draw_different_orders(tmp_path):
    rt = _runtime(tmp_path)
    ctx = ClientContext(rt, 0, 1)

    def order(epoch, stream):
        return np.concatenate([y.numpy() for _, y in ctx.batches(epoch, stream)])

    assert np.array_equal(order(0, "local"), order(0, "local"))
    assert not np.array_equal(order(0, "local"), order(1, "local"))
    assert not np.array_equal(order(0, "local"), order(0, "finetune"))
    assert not np.array_equal(order(0, "local"), order(0, "meta"))
    assert shuffle_purpose("local", 3) == "shuffle/3" and shuffle_purpose("meta", 2) == "shuffle/meta/2"
