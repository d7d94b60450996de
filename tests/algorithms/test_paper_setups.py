"""Every paper setup against its sources, and the generated table of docs/algorithms.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raysim.engine.experiment import algorithm_class
from raysim.engine.setups import DATASETS, check_sources, resolved, setups_section
from raysim.errors import ConfigError
from raysim.registry import ALGORITHMS

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


def doc_block() -> str:
    text = DOC.read_text()
    begin = text.index("<!-- paper-setups: generated")
    end = text.index("<!-- paper-setups: end -->") + len("<!-- paper-setups: end -->")
    return text[begin:end]


def test_the_docs_table_is_the_one_the_setups_generate():
    """Run ``python scripts/paper_setups.py --write`` after changing a paper setup or its sources."""
    assert doc_block() == setups_section()


def test_a_changed_setup_no_longer_matches_the_docs_table(monkeypatch):
    fedfcd = algorithm_class("fedfcd")
    original = fedfcd.paper_setup.__func__  # type: ignore[attr-defined]

    def changed(cls: Any, dataset: Any) -> dict[str, Any]:
        return {**original(cls, dataset), "train.batch_size": 32}

    monkeypatch.setattr(fedfcd, "paper_setup", classmethod(changed))
    assert doc_block() != setups_section()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS.names()))
def test_every_setting_of_a_paper_setup_names_its_source(algo):
    check_sources(algo)


def test_a_setting_without_a_source_is_refused(monkeypatch):
    fedpac = algorithm_class("fedpac")
    original = fedpac.setup_sources.__func__  # type: ignore[attr-defined]

    def fewer(cls: Any, dataset: Any) -> dict[str, Any]:
        return {k: v for k, v in original(cls, dataset).items() if k != "train.momentum"}

    monkeypatch.setattr(fedpac, "setup_sources", classmethod(fewer))
    with pytest.raises(ConfigError, match=r"missing \['train.momentum'\]"):
        check_sources("fedpac")


def test_fedfcds_setup_keeps_its_rate_constant_and_splits_as_the_paper_on_every_dataset():
    for dataset, _ in DATASETS:
        _, cfg = resolved("fedfcd", dataset)
        assert cfg.train.lr == 0.01 and cfg.train.lr_decay == 1.0 and cfg.train.lr_milestones == ()
        assert cfg.data.class_order == "random" and cfg.data.balance is False
        assert cfg.data.augment == "none"


def test_only_fed3p2_decays_its_rate_every_round():
    """A constant rate unless the paper decays: Fed3+2p's 0.99 a round (Sec. 5.1); FedDr+'s family
    steps down at its milestones instead."""
    decaying = set()
    for algo in ALGORITHMS.names():
        for dataset, _ in DATASETS:
            _, cfg = resolved(algo, dataset)
            if cfg.train.lr_decay != 1.0:
                decaying.add(algo)
    assert decaying == {"fed3p2"}


def test_feddrplus_trains_cifar_augmented_and_fashion_mnist_not():
    assert resolved("feddrplus", "cifar10")[1].data.augment == "crop_flip"
    assert resolved("feddrplus", "cifar100")[1].data.augment == "crop_flip"
    assert resolved("feddrplus", "fmnist")[1].data.augment == "none"


def test_the_table_is_of_raysims_own_algorithms_whatever_plugins_registered():
    from algorithms.base import Algorithm, register
    from raysim.engine.setups import builtin_algorithms

    @register("setup_table_plugin")
    class Plugin(Algorithm):
        pass

    try:
        assert "setup_table_plugin" in ALGORITHMS.names()
        assert "setup_table_plugin" not in builtin_algorithms()
        assert doc_block() == setups_section()
    finally:
        ALGORITHMS._entries.pop("setup_table_plugin", None)  # type: ignore[attr-defined]
