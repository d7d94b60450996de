"""The standard table's suite (suites/pfl_benchmark.yaml): every registered algorithm, on one footing.

Its page is read as "every algorithm, the same model, budget and seeds"; an algorithm registered
without its three rows, or a row that trains on other terms, would make the table quietly partial
or unfair. These checks read the suite as ``scripts/sweep.py`` expands it, running nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raysim.engine.setups import builtin_algorithms
from raysim.suite import load_suite, trials
from raysim.suite.spec import trial_experiment

SUITE = Path(__file__).resolve().parents[2] / "suites" / "pfl_benchmark.yaml"
REGIMES: dict[str, dict[str, Any]] = {
    "dir01": {"data.partition": "dirichlet:0.1"},
    "pat2": {"data.partition": "pathological:2"},
    "rot4": {
        "data.partition": "iid", "data.feature_shift": "rotate:4", "eval.new_clients": 0.2,
        "eval.new_client_epochs": 1,
    },
}  # fmt: skip
# what a row may set beyond its algorithm and regime, and why: the algorithms that are nothing but
# an asynchronous deployment run one (their rounds and evaluations are server steps, checked below
# to spend the same client epochs), FedBN needs BatchNorm layers, FedFomo its validation part
ASYNC_STEPS = ("rounds", "eval.every")
OWN: dict[str, dict[str, Any]] = {
    "fedasync": {"deployment.mode": "async", "deployment.buffer": 1},
    "fedbuff": {"deployment.mode": "async"},
    "fedbn": {"model": "cnn3p2_fmnist_bn"},
    "fedfomo": {"data.val_fraction": 0.2},
}


def test_every_registered_algorithm_has_a_row_in_every_regime() -> None:
    suite = load_suite(SUITE)
    names = {c.name for c in suite.configs}
    want = {f"{algo}_{regime}" for algo in builtin_algorithms() for regime in REGIMES}
    assert names == want, (sorted(want - names), sorted(names - want))
    assert suite.seeds == (0, 1)


def test_every_row_trains_on_the_same_terms_but_its_regime_and_its_algorithms_needs() -> None:
    suite = load_suite(SUITE)
    by_config: dict[str, list[dict]] = {}
    for t in trials(suite):
        by_config.setdefault(t.config, []).append(dict(t.settings))
    assert len(by_config) == 3 * len(builtin_algorithms()) > 0
    common = dict(suite.base)
    for config, settings in by_config.items():
        algo, regime = config.rsplit("_", 1)
        assert all(s == settings[0] for s in settings)  # the seeds differ only in the seed
        want = {**common, **REGIMES[regime], **OWN.get(algo, {}), "algo": algo}
        steps = {k: settings[0][k] for k in ASYNC_STEPS} if settings[0].get("deployment.mode") == "async" else {}
        assert settings[0] == {**want, **steps}, config
    assert common["paper_setup"] is False and common["rounds"] == 20 and common["model"] == "cnn3p2_fmnist"
    assert common["train.drop_last"] is True  # as PFLlib's loaders, and what FedBN's BatchNorm needs


def test_an_asynchronous_row_spends_the_client_epochs_of_the_others_and_is_evaluated_at_the_same() -> None:
    """An async round is one server step of ``buffer`` updates (one client epoch each, E = 1): its
    rounds x buffer are a synchronous row's rounds x K, and so is each evaluation's point."""
    from raysim.deployment.model import async_sizes

    suite = load_suite(SUITE)
    seen = set()
    for t in trials(suite):
        cfg = trial_experiment(t, Path("unused")).cfg
        if cfg.deployment.mode != "async":
            continue
        _, buffer = async_sizes(cfg)
        k = cfg.clients_per_round
        assert cfg.rounds * buffer == suite.base["rounds"] * k and cfg.eval.every * buffer == suite.base["eval.every"] * k, t.name
        assert cfg.train.local_epochs == 1
        seen.add(t.config.rsplit("_", 1)[0])
    assert seen == {"fedasync", "fedbuff"}


def test_no_trial_is_refused_by_what_only_its_data_tells() -> None:
    """Each trial's split is one ``scripts/sweep.py`` would make, and none is refused once the data
    is known (a refusal there ends the suite): every client has a full batch to train on (the last
    partial one is left out), and no model that cannot train on one sample is left a batch of one.
    One split per distinct data setting and seed, so the 282 trials cost a few dozen splits."""
    from raysim.data.federated import build_federated_data
    from raysim.engine.runner import check_batches

    suite = load_suite(SUITE)
    splits: dict[Any, Any] = {}
    checked = set()
    for t in trials(suite):
        cfg = trial_experiment(t, Path("unused")).cfg  # resolved and checked as the trial would be
        key = (repr(cfg.data), cfg.clients, cfg.seed)
        if key not in splits:
            splits[key] = build_federated_data(cfg.data, cfg.clients, cfg.seed)
            assert min(len(i) for i in splits[key].client_train) >= cfg.train.batch_size, t.name
        if (key, cfg.model, cfg.train.batch_size, cfg.train.drop_last) not in checked:
            check_batches(cfg, splits[key])
            checked.add((key, cfg.model, cfg.train.batch_size, cfg.train.drop_last))
    assert len(checked) < 50
