"""Golden metrics: every registered algorithm (and the variants whose code paths differ) on a short
serial run on synthetic data, recorded once so that a change of structure can show that it moved no
number. ``python -m tests.golden`` records them into ``tests/golden_metrics.json``;
``tests/engine/test_golden.py`` checks every case against that file with :func:`mismatches`.

What is compared, and to what:
- every integer, string, None and bool (rounds, sample and byte counts, cluster ids, ``None`` for a
  metric a run does not report) exactly;
- every float to ``|got - want| <= RTOL |want| + ATOL``.

Why a tolerance, and its evidence. PyTorch picks its CPU kernels from the processor (ATen's
``ATEN_CPU_CAPABILITY``, oneDNN's ISA, MKL's code path), and each choice sums in its own order: the
last bits of a trained model differ between an AVX2 and an AVX-512 kernel, and between Intel's and
AMD's processors even with the same capability pinned. The file holds the numbers of an Intel
Sapphire Rapids machine with AVX2 kernels pinned (``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2``). The 48 cases of commit baa47f7 were run against it on a
2-core AMD EPYC (Zen 4, AVX-512) under four kernel choices: that pinning; the processor's own choice (AVX-512,
oneDNN on); ``ATEN_CPU_CAPABILITY=default`` with ``MKL_CBWR=COMPATIBLE`` and oneDNN off; and
``avx2`` with ``MKL_CBWR=AVX2`` and oneDNN off. No case was equal to the bit under any of them; no
integer, count or accuracy moved; the largest float difference was 7.0e-6 of the value (``fedpac``'s
second-round train loss, with scalar kernels) and, for values near zero, 4.0e-8 absolute (an
alignment of 0.0027 in ``fedavg-analyses``). So every float stays within 7 % of the bound below.

A change that means something moves far more: ``train.lr`` times 1.001 in one case moves its third
round's train loss by 4e-3 of the value (40 times RTOL) and flips test predictions (an accuracy
moves by a whole sample). ``tests/engine/test_golden.py`` makes that change on every run of the
suite and checks that the comparison fails. What the tolerance cannot see is a change that only
reorders a sum (a few ulps): that exactness is checked where it is an invariant, on one machine,
by the serial-against-Ray and determinism tests (``tests/engine/test_determinism.py``).

The cases. ``CASES`` has one case per registered algorithm, its entry's settings over ``BASE``,
and one for each variant whose code path differs (a reading of a paper, a loss, a regulariser,
fine-tuning, the analyses, an asynchronous deployment). ``fedavg-nchw`` and ``fed3p2-nchw`` run
``fedavg`` and ``fed3p2`` in the NCHW layout (``train.channels_last=false``), so that the layout
all models had before commit 2c34127 keeps its numbers.

Recording. ``python -m tests.golden NAME ...`` runs the named cases and writes their numbers into
``tests/golden_metrics.json``, keeping every other case's; without a name it records every case.
Any machine's kernels will do (any choice is within the tolerance of the others). A new algorithm
or variant adds its case and records it; a change that means to move a case's numbers records that
case again, and its commit says why; any other change leaves the file as it is.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLDEN_FILE = Path(__file__).with_name("golden_metrics.json")

#: a float matches its recorded value when ``|got - want| <= RTOL * |want| + ATOL`` (the module's
#: docstring has the measured spread across kernel choices this bounds, and what it still catches)
RTOL = 1e-4
ATOL = 1e-6

#: a 16x16 synthetic image set and the Fed3+2p CNN, whose filter is a real layer
BASE: dict[str, Any] = {
    "model": "cnn3p2_fmnist",
    "data.synthetic.shape": (1, 16, 16),
    "rounds": 3,
    "train.lr": 0.05,
    "data.synthetic.separation": 1.0,
    # the schedule every case is recorded with: a rate decayed by 0.99 a round (the default is a
    # constant rate)
    "train.lr_decay": 0.99,
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
    "fedbn": {"algo": "fedbn", "model": "cnn3p2_fmnist_bn", "train.drop_last": True},
    "lgfedavg": {"algo": "lgfedavg"},
    "moon": {"algo": "moon"},
    "apfl": {"algo": "apfl"},
    "apfl-fixed": {"algo": "apfl", "algo.adapt_alpha": False, "algo.alpha": 0.25},
    "fedala": {"algo": "fedala"},
    "fedfomo": {"algo": "fedfomo", "data.val_fraction": 0.2, "algo.m": 3},
    "ifca": {"algo": "ifca", "algo.num_clusters": 3},
    "fedavg-kd-ld-prox": {"algo": "fedavg", "algo.regularizers": ["kd", "ld", "prox"]},
    "fedbabu-ntd-fd-ft": {"algo": "fedbabu", "algo.regularizers": ["ntd", "fd"], "algo.reg_beta": 0.5},
    "fedavg-ft": {"algo": "fedavg", "algo.ft_epochs": 1},
    "spherefed-ft": {"algo": "spherefed", "train.lr": 0.5, "algo.ft_epochs": 1},
    "fedetf-ft": {"algo": "fedetf", "train.lr": 0.1, "algo.ft_epochs": 1, "algo.ft_alternations": 2},
    "fedavg-analyses": {"algo": "fedavg", "eval.analyses": True, "data.partition": "shard:2"},
    # stale updates rebased and FedBuff's server step, on slow and varied devices
    "fedbuff": {"algo": "fedbuff", "deployment.mode": "async", "deployment.devices": "lognormal:1"},
    # FedAsync's mixing of each arrival, with the hinge staleness and a staleness limit
    "fedasync": {
        "algo": "fedasync",
        "deployment.mode": "async",
        "deployment.buffer": 1,
        "deployment.devices": "lognormal:1",
        "deployment.staleness": "hinge:2:1",
        "deployment.max_staleness": 4,
    },
    # clients held out of training, each evaluated as a newcomer (eval.new_clients)
    "fedavg-new-clients": {"algo": "fedavg", "eval.new_clients": 0.25, "eval.new_client_epochs": 1},
    "fedper-new-clients": {"algo": "fedper", "eval.new_clients": 0.25, "eval.new_client_epochs": 1},
    # features that differ between clients: four rotated domains, G-Test reported per domain
    "fedavg-rotate": {"algo": "fedavg", "data.feature_shift": "rotate:4"},
    "fedavg-corrupt": {"algo": "fedavg", "data.feature_shift": "corrupt:6"},
    # the NCHW layout (train.channels_last=false): the numbers recorded before channels-last came
    "fedavg-nchw": {"algo": "fedavg", "train.channels_last": False},
    # the server optimisers (raysim/capabilities/server_opt.py), each registered one
    "fedavgm": {"algo": "fedavgm"},
    # partial work, so that the clients' step counts differ and FedNova's normalisation matters
    "fednova": {"algo": "fednova", "deployment.completeness": "uniform:0.3"},
    "qffl": {"algo": "qffl", "algo.q": 1.0},
    "fedcp": {"algo": "fedcp"},
    # kappa 50 (the authors' script, for their rate 0.005 without momentum) diverges at this base's
    # rate 0.05 with momentum 0.9
    "feddbe": {"algo": "feddbe", "algo.kappa": 1.0},
    "fedas": {"algo": "fedas"},
    "pfedhn": {"algo": "pfedhn", "algo.inner_steps": 5},
    "pfedhn-mean": {"algo": "pfedhn", "algo.inner_steps": 5, "algo.round_steps": "mean"},
    "fedadam": {"algo": "fedadam"},
    "fedyogi": {"algo": "fedyogi"},
    "fedadagrad": {"algo": "fedadagrad"},
    # client-level DP: DP-FedAvg's noised mean (Poisson sampling, adaptive clip), and the releases
    # an algorithm makes itself (Fed3+2p's chains, groups and noised label rows; SCAFFOLD's pairs)
    "fedavg-dp": {
        "algo": "fedavg", "privacy.clip": "adaptive:0.5", "privacy.noise_multiplier": 0.8,
        "privacy.count_noise_multiplier": 2.0, "privacy.sampling": "poisson",
    },  # fmt: skip
    "fed3p2-dp": {"algo": "fed3p2", "privacy.clip": "1.0", "privacy.noise_multiplier": 0.5},
    "scaffold-dp": {"algo": "scaffold", "privacy.clip": "1.0", "privacy.noise_multiplier": 0.5},
    # sample-level DP: DP-SGD in every client's training
    "fedavg-dpsgd": {"algo": "fedavg", "privacy.example_clip": 1.0, "privacy.example_noise_multiplier": 1.0},
}
CASES["fed3p2-nchw"] = {**CASES["fed3p2"], "train.channels_last": False}


def one_case_per_algorithm() -> list[str]:
    """The first case of each algorithm raysim ships (``algorithms/``), in name order: what a test
    of every algorithm runs."""
    from raysim.engine.setups import builtin_algorithms

    return [next(case for case, s in CASES.items() if s["algo"] == name) for name in sorted(builtin_algorithms())]


def case_config(name: str, out: Path, **changes: Any) -> Any:
    from tests.conftest import tiny_config

    return tiny_config(out, **{**BASE, **CASES[name], **changes})


def run_case(name: str, out: Path, **changes: Any) -> dict[str, Any]:
    """The run's metric rows and per-client rows, without wall times (``changes``: settings over
    the case's, for a run that is meant to differ from it)."""
    import pyarrow.parquet as pq

    from raysim.engine.runner import run_experiment
    from tests.conftest import without_times

    result = run_experiment(case_config(name, out, **changes))
    clients = pq.read_table(out / "clients.parquet").to_pylist()
    return {"rows": without_times(result.rows), "clients": clients}


def mismatches(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from the recorded ``want`` (nested dicts and lists of a case, as the file
    holds them): a float past the tolerance, any other value not equal; one line each. Only the
    keys ``want`` has are compared (columns added since a case was recorded are not in the file)."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: {got!r} where a table was recorded"]
        return [m for k in want for m in mismatches(got.get(k, _ABSENT), want[k], f"{where}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {len(got) if isinstance(got, list) else got!r} items, recorded {len(want)}"]
        return [m for i, (g, w) in enumerate(zip(got, want, strict=True)) for m in mismatches(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):
        if abs(got - want) <= RTOL * abs(want) + ATOL:
            return []
        return [f"{where}: {got!r}, recorded {want!r} (off by {abs(got - want) / max(abs(want), 1e-300):.2g} of it)"]
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r}, recorded {want!r}"]
    return []


_ABSENT = object()


def record(names: list[str]) -> None:
    golden: dict[str, Any] = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            golden[name] = run_case(name, Path(tmp) / name)
            print(f"recorded {name}", file=sys.stderr)
    GOLDEN_FILE.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(sys.argv[1:] or list(CASES))
