"""Evaluation, the same for every executor: what the global model must predict, which clients'
personalised models are evaluated, and how the workers' parts add up to one report."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from raysim.config import ExperimentConfig
from raysim.data import FederatedData
from raysim.records import ClientEval, EvalPart, EvalReport, EvalTarget, RoundStats


def eval_targets(data: FederatedData) -> list[EvalTarget]:
    """What the global model must predict: the union of the clients' P-Tests and, when P-Tests are
    not drawn from G-Test (``split`` mode), G-Test too. In ``matched`` mode one pass over G-Test
    gives both ``gm_gtest`` and every ``gm_ptest``."""
    ptest_union = np.unique(np.concatenate(data.client_test)) if data.num_clients else np.zeros(0, np.int64)
    all_gtest = np.arange(len(data.gtest))
    if data.ptest is data.gtest:
        return [EvalTarget("ptest", np.union1d(ptest_union, all_gtest), leads=True)]
    return [EvalTarget("ptest", ptest_union, leads=True), EvalTarget("gtest", all_gtest)]


def evaluated_clients(cfg: ExperimentConfig, personal: bool, clients: Iterable[int]) -> list[int]:
    """Of ``clients``, those whose own models are evaluated: all where the algorithm has personal
    models (``personal``), and always those held out of training (``eval.new_clients``), whose
    models are a newcomer's."""
    new = set(cfg.new_clients)
    return [int(c) for c in clients if personal or c in new]


def validation_target(data: FederatedData) -> EvalTarget:
    """The clients' validation parts (indices into ``data.train``)."""
    return EvalTarget(
        "train", np.unique(np.concatenate(data.client_val)) if data.num_clients else np.zeros(0, np.int64)
    )


def accuracy_of(parts: Sequence[EvalPart]) -> float:
    correct = np.concatenate([p.global_correct[0] for p in parts])
    return float(correct.mean()) if correct.size else float("nan")


def split_targets(targets: Sequence[EvalTarget], parts: int) -> list[list[EvalTarget]]:
    """Each target cut into ``parts`` contiguous chunks, one list per worker."""
    out: list[list[EvalTarget]] = [[] for _ in range(parts)]
    for t in targets:
        for w, chunk in enumerate(np.array_split(t.indices, parts)):
            out[w].append(EvalTarget(t.pool, chunk, t.leads and w == 0))
    return out


def assemble_report(
    data: FederatedData,
    targets: Sequence[EvalTarget],
    parts: Sequence[EvalPart],
    has_global: bool,
    new_clients: Sequence[int] = (),
) -> EvalReport:
    """Per-client and G-Test counts from the workers' parts (``parts[w]`` answered
    ``split_targets(targets, len(parts))[w]``); ``new_clients`` are those held out of training
    (``eval.new_clients``). Under ``data.feature_shift``, G-Test's counts per domain too."""
    bits = {"ptest": np.zeros(len(data.ptest), bool), "gtest": np.zeros(len(data.gtest), bool)}
    analysed = has_global and bool(parts) and all(len(p.global_align) == len(p.global_correct) > 0 for p in parts)
    align = {pool: np.zeros(len(getattr(data, pool)), np.float32) for pool in bits} if analysed else {}
    norm = {pool: np.zeros(len(getattr(data, pool)), np.float32) for pool in bits} if analysed else {}
    for chunks, part in zip(split_targets(targets, len(parts)), parts, strict=True):
        for i, (t, correct) in enumerate(zip(chunks, part.global_correct, strict=True)):
            bits[t.pool][t.indices] = correct
            if analysed:
                align[t.pool][t.indices] = part.global_align[i]
                norm[t.pool][t.indices] = part.global_norm[i]
    if data.ptest is data.gtest:
        bits["gtest"] = bits["ptest"]
        if analysed:
            align["gtest"], norm["gtest"] = align["ptest"], norm["ptest"]
    splits: dict[int, dict[str, float | None]] = {}
    class_acc = None
    if analysed:  # the global model on G-Test, by class and by each client's observed classes
        from raysim.results.analysis import ClassStats

        stats = ClassStats.of(data.gtest.y, bits["gtest"], align["gtest"], norm["gtest"], data.num_classes)
        class_acc = stats.class_accuracy()
        observed = data.train_label_counts() > 0
        splits = {c: stats.split(observed[c]) for c in range(data.num_clients)}
    personal = dict(p for part in parts for p in part.personal_correct)
    held = set(new_clients)
    client_domains = data.client_domains
    clients = tuple(
        ClientEval(
            client=c,
            n_test=int(data.client_test[c].size),
            gm_correct=int(bits["ptest"][data.client_test[c]].sum()) if has_global else None,
            lm_correct=personal.get(c),
            gm_split=splits.get(c),
            new=c in held,
            domain=None if client_domains is None else int(client_domains[c]),
        )
        for c in range(data.num_clients)
    )
    gtest_domains: tuple[tuple[int, int], ...] = ()
    domain_of = data.gtest_domains
    if has_global and domain_of is not None:
        gtest_domains = tuple(
            (int(bits["gtest"][domain_of == d].sum()), int((domain_of == d).sum())) for d in range(int(domain_of.max()) + 1)
        )
    features = [f for part in parts for f in part.features]  # the global model's, then client by client
    return EvalReport(
        clients,
        int(bits["gtest"].sum()) if has_global else None,
        len(data.gtest),
        gm_class_acc=class_acc,
        features=tuple(sorted(features, key=_feature_order)),
        gtest_domains=gtest_domains,
    )


def _feature_order(feature: tuple[str, object]) -> int:
    name = feature[0]
    return -1 if name == "global" else int(name.removeprefix("client_"))


def validated(stats: RoundStats, rnd: int, measure: Callable[[int], float]) -> RoundStats:
    """A round's stats, with the global model's validation accuracy ``val_gm`` among its scalars
    when the algorithm asked for it (``stats.validate``): ``measure(rnd)`` evaluates it and passes
    it back to the server (the algorithm's ``validation`` capability). Both executors end
    ``train_round`` with this, so the round asks for what it needs, and the runner never sees it."""
    if not stats.validate:
        return stats
    return dataclasses.replace(stats, scalars=(*stats.scalars, ("val_gm", measure(rnd))))


__all__ = ["accuracy_of", "assemble_report", "eval_targets", "split_targets", "validated", "validation_target"]
