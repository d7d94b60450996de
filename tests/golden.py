"""Golden metrics: every registered algorithm (and the variants whose code paths differ) on a short
serial run on synthetic data, recorded once so that a change of structure can show that it moved no
number. ``python -m tests.golden`` records them into ``tests/golden_metrics.json``;
``tests/engine/test_golden.py`` checks every case against that file, to the last bit.

The file was recorded on commit 31f9591, before the dependency restructuring of issue 11; a case of
an algorithm added since was recorded when the algorithm landed. Cases recorded again since, each
for a change that meant to move its numbers: ``fedprox``, when its proximal term's anchor became the
received model (it had been whatever the worker's model held before the job); ``pfedme``, when its
inner problem stopped solving on each epoch's last, partial batch (issue 30); ``fedavg-analyses``,
when the analyses gained FedDr+'s Fig. 4 columns (``local_*_fdist``, ``*_fangle``, ``*_fnormdiff``,
issue 27): only those columns were added, every recorded value stayed; ``gpfl``, when its mu
regulariser was narrowed to GCE and CoV, as the authors' optimizers apply it (stop 36). ``python -m tests.golden
NAME`` records one case; without a name it records every one.

Every case was recorded again when models took the channels-last layout (``train.channels_last``,
issue 29): its kernels sum in another order. Before that, every case was run with the layout off
(NCHW) and gave its recorded numbers to the bit; ``fedavg-nchw`` and ``fed3p2-nchw`` keep
``fedavg``'s and ``fed3p2``'s numbers of before, so that NCHW stays as it was.

The numbers are those of PyTorch's AVX2 kernels, which ``tests/conftest.py`` selects (an AVX-512
kernel sums in another order), and of MKL's matrix products in its AVX2 reproducibility mode
(``MKL_CBWR=AVX2``, also set there); record with it imported, as ``python -m tests.golden`` does.
Every case was recorded again when that mode was added (stop 39): MKL picks its kernels from the
processor whatever ATen and oneDNN were told, and on a Sapphire Rapids machine its default ones gave
every case's train loss other last bits (at most 4.3e-7 of the value). Commit 330c9d9 and the
commit that recorded them give the same numbers to the bit in that mode.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN_FILE = Path(__file__).with_name("golden_metrics.json")

#: a 16x16 synthetic image set and the Fed3+2p CNN, whose filter is a real layer
BASE: dict[str, Any] = {
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "rounds": 3,
    "train.lr": 0.05,
    "data.synthetic.separation": 1.0,
}

#: case name -> settings over ``BASE``; one case per registered algorithm, plus the variants
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {"algo": "fedavg"},
    "fedprox": {"algo": "fedprox", "algo.mu": 0.1},
    "local": {"algo": "local"},
    "local-ce-etf": {"algo": "local", "algo.loss": "ce_etf"},
    "local-dr": {"algo": "local", "algo.loss": "dr", "train.lr": 0.3},
    "fedper": {"algo": "fedper"},
    "fedrep": {"algo": "fedrep", "algo.head_epochs": 2, "algo.body_epochs": 1},
    "fedrod": {"algo": "fedrod"},
    "ditto": {"algo": "ditto", "algo.personal_epochs": 2},
    "scaffold": {"algo": "scaffold"},
    "fed3p2": {"algo": "fed3p2", "algo.num_type_a": 3, "algo.num_type_b": 2},
    "fed3p2-personal-filters": {"algo": "fed3p2", "algo.num_type_a": 3, "algo.filter_shared": False},
    "fed3p2-no-coordinators": {"algo": "fed3p2", "algo.coordinators": False},
    "fed3p2-one-phase": {"algo": "fed3p2", "algo.two_phase": False},
    "fed3p2-eq4-all": {"algo": "fed3p2", "algo.num_type_a": 2, "algo.server_denominator": "all"},
    "fed3p2-auto": {
        "algo": "fed3p2",
        "algo.num_type_a": 2,
        "algo.phase_switch": "auto",
        "algo.switch_patience": 1,
        "data.val_fraction": 0.2,
    },
    "fedproto": {"algo": "fedproto"},
    "fedproto-head": {"algo": "fedproto", "algo.predict": "head"},
    "fedgh": {"algo": "fedgh"},
    "fedfcd": {"algo": "fedfcd", "train.local_epochs": 2},
    "fedfcd-joint-no-fusion": {
        "algo": "fedfcd",
        "train.local_epochs": 2,
        "algo.alternate": False,
        "algo.fusion": False,
    },
    "fedpac": {"algo": "fedpac", "participation": 0.5},
    "fedpac-head-prox": {"algo": "fedpac", "participation": 0.5, "algo.head_prox_mu": 0.1, "algo.head_epochs": 2},
    "feddrplus": {"algo": "feddrplus", "train.lr": 0.3},
    "feddrplus-ft-drplus": {"algo": "feddrplus", "train.lr": 0.3, "algo.ft_loss": "drplus", "algo.ft_epochs": 2},
    "dotreg": {"algo": "dotreg", "train.lr": 0.3},
    "fedbabu": {"algo": "fedbabu", "algo.ft_epochs": 2},
    "feddyn": {"algo": "feddyn", "algo.alpha": 0.1},
    "perfedavg": {"algo": "perfedavg", "algo.alpha": 0.02},
    "perfedavg-hf": {"algo": "perfedavg", "algo.alpha": 0.02, "algo.variant": "hf"},
    "pfedme": {"algo": "pfedme", "algo.k_steps": 2},
    "fedamp": {"algo": "fedamp", "algo.sigma": 1e6},
    "cfl": {"algo": "cfl", "algo.start_round": 2, "algo.eps1": 100.0, "algo.eps2": 0.0},
    "pacfl": {"algo": "pacfl", "algo.threshold": 40.0},
    "pacfl-principal": {"algo": "pacfl", "algo.proximity": "principal", "algo.num_clusters": 3},
    "fedclust": {"algo": "fedclust", "algo.num_clusters": 2},
    "gpfl": {"algo": "gpfl"},
    "fedntd": {"algo": "fedntd"},
    "fedexp": {"algo": "fedexp"},
    "fedavg-kd-ld-prox": {"algo": "fedavg", "algo.regularizers": ["kd", "ld", "prox"]},
    "fedbabu-ntd-fd-ft": {"algo": "fedbabu", "algo.regularizers": ["ntd", "fd"], "algo.reg_beta": 0.5},
    "fedavg-ft": {"algo": "fedavg", "algo.ft_epochs": 1},
    "spherefed-ft": {"algo": "spherefed", "train.lr": 0.5, "algo.ft_epochs": 1},
    "fedetf-ft": {"algo": "fedetf", "train.lr": 0.1, "algo.ft_epochs": 1, "algo.ft_alternations": 2},
    "fedavg-analyses": {"algo": "fedavg", "eval.analyses": True, "data.partition": "shard:2"},
    # issue 28: stale updates rebased and FedBuff's server step, on slow and varied devices
    "fedbuff": {"algo": "fedbuff", "deployment.mode": "async", "deployment.devices": "lognormal:1"},
    # issue 29: the NCHW layout (train.channels_last=false) gives the numbers of before it, to the bit
    "fedavg-nchw": {"algo": "fedavg", "train.channels_last": False},
}
CASES["fed3p2-nchw"] = {**CASES["fed3p2"], "train.channels_last": False}


def case_config(name: str, out: Path) -> Any:
    from tests.conftest import tiny_config

    return tiny_config(out, **{**BASE, **CASES[name]})


def run_case(name: str, out: Path) -> dict[str, Any]:
    """The run's metric rows and per-client rows, without wall times."""
    import pyarrow.parquet as pq

    from raysim.engine.runner import run_experiment
    from tests.conftest import without_times

    result = run_experiment(case_config(name, out))
    clients = pq.read_table(out / "clients.parquet").to_pylist()
    return {"rows": without_times(result.rows), "clients": clients}


def record(names: list[str]) -> None:
    golden: dict[str, Any] = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            golden[name] = run_case(name, Path(tmp) / name)
            print(f"recorded {name}", file=sys.stderr)
    GOLDEN_FILE.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(sys.argv[1:] or list(CASES))
