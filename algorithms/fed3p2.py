"""Fed3+2p ("Fed3+2p: Training different parts of neural network with two-phase strategy", seed
002): a three-part network trained in two phases with two kinds of coordinators.

Network (Fig. 2): extractor W_e, filter W_i, G-head W_g and P-head W_p (``SplitModel``'s
``extractor``, ``filter``, ``head``, ``phead``).

Phase 1 (rounds 1..T1) trains W = {W_e, W_i, W_g} with cross-entropy on the G-head.
- Type-A coordinators (Eq. 5, :func:`algorithms.grouping.type_a_grouping`), made once before round 1.
- Each coordinator trains its clients one after another on one model, in a seeded random order
  (Eq. 6-7): a chain job. Coordinators run in parallel.
- Who trains in a coordinator's chain each round is where the paper is open (Step 3 says "all the
  clients managed by coordinator c", Sec. 5.1 samples 20% of the clients a round);
  ``chain_sampling`` reads it four ways. Per round, against FedAvg at the same participation rho
  (rho N clients):

  - ``global`` (default): the round's sampled clients (rho N, as FedAvg), each coordinator
    chaining its own sampled members: chains of 0 to many clients, each far from the global label
    distribution (at rho = 0.2 on FMNIST Dir(0.1), mean KL about 0.58 nats).
  - ``coordinators``: whole coordinators, drawn in a seeded order until their members reach rho N:
    rho N rounded up to whole coordinators (exactly rho N when N/C_A divides it, e.g. 20 of 100
    with 5 coordinators), each chain a whole coordinator (KL near 0).
  - ``all``: every member of every coordinator, every round (Step 3 read literally): N clients,
    1/rho times FedAvg's (5 times at rho = 0.2).
  - ``regroup``: the round's sampled clients (rho N, as FedAvg), split afresh into ``num_type_a``
    chains by the balanced-KL grouping of Eq. 5: chains of near-equal length, each near the
    round's label distribution.

  Every run records its compute (``samples_trained``, ``client_epochs``) to compare readings at
  equal compute, and logs per round ``chain_kl`` (the mean over the round's chains of the KL of
  the chain's clients' label distribution from the global one) and ``round_kl`` (of all the
  round's clients together).
- A client's update inside a chain (Eq. 9 writes one gradient step; Sec. 5.1 gives E = 5 epochs):
  ``chain_epochs`` epochs (default E), or ``chain_steps`` SGD steps (1: Eq. 9 read literally);
  SGD with momentum 0.9 (Sec. 5.1) whose buffers start from zero for each client
  (``chain_momentum="restart"``) or carry along the chain with the weights (``"carry"``: client
  k+1's optimizer starts with client k's last buffers; the paper is silent).
- Server, Eq. 4: W(t+1) = W(t) - sum_c |D^c|/|D| * DeltaW^c with DeltaW^c = W(t) - W^c (Eq. 8);
  |D^c| is the training data of coordinator c's clients sampled this round. The paper defines
  D = U D^c, "all training samples", which reads two ways: ``server_denominator="round"`` (the
  default, as docs/algorithms.md states it) takes |D| as the sum of this round's |D^c|, so the weights sum
  to 1 as in FedAvg; ``server_denominator="all"`` takes |D| as every client's training data, so
  the server moves W only by about the participation rate of the coordinators' average change.
- The phase-1 W is the global model GM.

Phase 2 (rounds T1+1..T) trains filters and P-heads; W_e and W_g stay frozen at their phase-1 values.
- Type-B groups (Eq. 10, :func:`algorithms.grouping.type_b_grouping`).
- Each group's filter and each client's P-head start freshly initialised (seeded); the learning rate
  starts again from its initial value.
- Sampled clients train filter + P-head (cross-entropy on P-head(filter(extractor(x))), Eq. 12-13);
  each group averages its members' filters weighted by sample count (Eq. 11); P-heads never leave
  their client.
- The local model LM of client k: extractor -> the filter of k's group -> P-head_k.

Phase lengths: ``phase1_rounds`` (T1) and ``phase2_rounds`` (T2) must add up to the run's rounds;
given one, the other is the rest; given neither, T1 = T/2 (a choice: the paper gives 100 rounds in
all and no split). Table 2's G column for "- Coordinator" equals "- 2ST. Train" on FMNIST and
CIFAR-100 (64.0 against 63.9 on CIFAR-10), which suggests a global model trained as long as FedAvg's: ``phase1_rounds=T`` with
``phase2_rounds`` after it (and ``--rounds T + T2``). Phase switch: after T1 rounds, or with
``phase_switch="auto"`` when the GM's accuracy on the clients' held-out validation parts
(``data.val_fraction``) has not improved by ``switch_delta`` for ``switch_patience`` rounds (the
paper's stated future work), at the latest after ``phase1_rounds`` rounds if given, else after T-1. The accuracy is first smoothed, s_t = beta * s_(t-1) + (1 - beta) * a_t with
beta = ``switch_smoothing``: the phase-1 GM swings by tens of points from round to round (each
coordinator's model ends on its last client), and on the raw accuracy one early lucky round stopped
phase 1 after 6 of 100 rounds on FMNIST (GM 32%).

Ablations (Table 2), progressive as Sec. 5.3 does them, each flag removing what the one before it
removed and more: ``filter_shared=false`` (no Type-B groups: every client keeps its own filter;
Type-A kept), ``coordinators=false`` (no Type-A and no Type-B: phase 1 is plain parallel FedAvg and
phase 2 trains filter and P-head locally), ``two_phase=false`` (no coordinators and one phase:
extractor, filter and G-head averaged as in FedAvg while each client trains its own P-head beside
them; the loss is the sum of the two heads' cross-entropies, a choice: the paper does not give it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from algorithms.base import Algorithm, Evaluation, register
from algorithms.grouping import Grouping, group_kl, type_a_grouping, type_b_grouping
from raysim import rng
from raysim.capabilities.asynchronous import Asynchronous
from raysim.capabilities.batching import Batching
from raysim.capabilities.private_release import PrivateRelease
from raysim.capabilities.round_log import RoundLog
from raysim.capabilities.validation import Validation
from raysim.config import ExperimentConfig, setting
from raysim.errors import ConfigError
from raysim.registry import DatasetInfo
from raysim.setups import Source, Stated
from raysim.toolkit.aggregate import apply_updates, average_uploads, subtract, weighted_mean
from raysim.weights import GLOBAL_PARTS, ModelWeights
from raysim.wire import ClientResult, Job, JobResult, ServerContext, WeightsPayload

if TYPE_CHECKING:
    import torch

    from raysim.models import SplitModel
    from raysim.privacy.client_level import Release
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.train import LossFn, TrainStats

FROZEN_PARTS = ("extractor", "head")  # phase 2 keeps these at their phase-1 values


@dataclass(frozen=True)
class Fed3p2Config:
    num_type_a: int = setting(5, at_least=1)  # Type-A coordinators (choice; the paper does not give the number)
    num_type_b: int = setting(5, at_least=1)  # Type-B groups M (choice; the paper's A.2 varies it)
    phase1_rounds: int | None = setting(None, at_least=0)  # T1; None: the rounds less phase2_rounds, or half of them (choice)
    phase2_rounds: int | None = setting(None, at_least=0)  # T2; None: the rounds less T1
    phase_switch: Literal["fixed", "auto"] = "fixed"  # fixed | auto (switch when the GM's validation accuracy stalls)
    switch_patience: int = setting(10, at_least=1)  # auto: rounds without an improvement of switch_delta
    switch_delta: float = 0.001
    switch_smoothing: float = setting(0.8, at_least=0, below=1)  # auto: beta of the moving average of the validation accuracy
    filter_shared: bool = True  # Table 2 ablation: False = no Type-B groups, personal filters
    coordinators: bool = True  # Table 2 ablation: False = FedAvg phase 1, local phase 2
    two_phase: bool = True  # Table 2 ablation: False = one phase, no coordinators
    server_denominator: Literal["round", "all"] = "round"  # Eq. 4's |D|: round = this round's data, all = all clients' data
    chain_sampling: Literal["global", "coordinators", "all", "regroup"] = "global"  # who trains in a coordinator's chain: global | coordinators | all | regroup
    chain_epochs: int | None = setting(None, at_least=0)  # a client's local epochs inside a chain; None: E
    chain_steps: int | None = setting(None, at_least=1)  # or this many SGD steps instead (1: Eq. 9 read literally)
    chain_momentum: Literal["restart", "carry"] = "restart"  # restart: fresh per client | carry: along the chain


@dataclass(frozen=True)
class ChainPayload:
    """What a client in a coordinator's chain receives: W^c and, when momentum carries along the
    chain, the optimizer's momentum buffers the previous client ended with."""

    weights: ModelWeights
    lr: float
    momentum: ModelWeights | None = None


@dataclass(frozen=True)
class Phase2Payload:
    """What a phase-2 client receives: the frozen phase-1 parts, its group's filter (None before
    the group's first aggregation: the client starts from the group's seeded fresh filter)."""

    frozen: ModelWeights  # extractor, head
    group: int  # Type-B group, or -1 when filters are personal
    filter: ModelWeights | None
    lr: float


@dataclass(frozen=True)
class JointPayload:
    """two_phase=false: the global extractor, filter and G-head, trained with the client's P-head."""

    weights: ModelWeights
    lr: float


@dataclass(frozen=True)
class Fed3p2State:
    rnd: int  # the last aggregated round (0 before round 1)
    gm: ModelWeights  # W = {W_e, W_i, W_g}; frozen once phase 2 starts
    type_a: Grouping | None
    type_b: Grouping | None
    group_filters: tuple[ModelWeights | None, ...]  # per Type-B group, None until first aggregated
    t1: int | None  # the last phase-1 round; None while the automatic switch has not happened
    best_val: float = -1.0  # auto: the best smoothed validation accuracy of the GM so far
    smoothed_val: float | None = None  # auto: the moving average of the GM's validation accuracy
    since_best: int = 0  # auto: rounds since it improved by switch_delta
    data_size: int = 0  # every client's training samples (Eq. 4's |D| with server_denominator="all")
    chain_kl: float | None = None  # the last phase-1 round's mean KL of its chains from the global labels
    round_kl: float | None = None  # ... and of all its clients together


@dataclass(frozen=True)
class Fed3p2Eval:
    gm: ModelWeights
    personal: bool  # whether local models exist yet (phase 2, or two_phase=false)
    group_of: tuple[int, ...] | None
    group_filters: tuple[ModelWeights | None, ...]


@dataclass(frozen=True)
class Update:
    """One local update of Fed3+2p: the client loads ``start``, trains ``parts`` with ``loss``
    (for E epochs, or ``epochs``, or ``steps`` SGD steps, from ``momentum``), keeps the trained
    ``keep`` parts on its home worker and uploads the trained ``upload`` parts (and, with
    ``carry_momentum``, its momentum buffers for the chain's next client)."""

    start: ModelWeights
    parts: tuple[str, ...]
    loss: LossFn
    keep: tuple[str, ...] = ()
    upload: tuple[str, ...] = ()
    epochs: int | None = None
    steps: int | None = None
    momentum: ModelWeights | None = None
    carry_momentum: bool = False

    def finish(self, ctx: ClientContext, stats: TrainStats, trained: ModelWeights) -> ClientResult:
        """What the client keeps and sends after training ``trained`` (its ``parts``)."""
        if self.keep:
            ctx.keep(trained.select(self.keep))
        carried = ctx.momentum_of(stats, self.parts) if self.carry_momentum else None
        return ctx.result(stats, weights=trained.select(self.upload) if self.upload else None, extra=carried)


@register("fed3p2")
class Fed3p2(Algorithm[Fed3p2State]):
    #: train.batch_clients: phase 1's chains train side by side, their k-th clients in one batched
    #: step (and phase 1 without coordinators as FedAvg); phase 2's clients of one Type-B group (or
    #: all, with personal filters) train their filters and P-heads together, each from its own
    #: (two_phase=false likewise); these jobs are pinned, and a batch runs on one home worker
    family = "split"
    batching = Batching(pinned=True)
    asynchronous = Asynchronous(
        why_not="its phase-1 chains pass one model from client to client within a round and its phase-2 filters are "
        "averaged per Type-B group, so no round is a weighted average of uploads from one global model."
    )
    private_release = PrivateRelease(
        clipped="each coordinator's chain's change of W (sensitivity 2C: one client moves its chain's "
        "clipped change to another of norm at most C) over the coordinators, each Type-B group's filter "
        "uploads over its expected sampled members, and the clients' label distributions, released "
        "once with noise for the groupings; the P-heads never leave their clients",
        statistics=lambda cfg, params: int(params.coordinators and params.two_phase),
        not_adaptive="its phase-1 units are chains, not clients, and a chain's clipped count is not the "
        "quantile estimate of one client's update norm",
    )
    Config = Fed3p2Config
    has_personal_model = True
    validation = Validation()  # the automatic switch (phase_switch=auto)
    round_log = RoundLog()

    def __init__(self, cfg: ExperimentConfig, params: Fed3p2Config) -> None:
        super().__init__(cfg, params)
        self.auto = params.phase_switch == "auto" and params.two_phase
        if not params.two_phase:
            self.fixed_t1: int | None = cfg.rounds
        elif self.auto:
            self.fixed_t1 = None
        elif params.phase1_rounds is not None:
            self.fixed_t1 = params.phase1_rounds
        elif params.phase2_rounds is not None:
            self.fixed_t1 = cfg.rounds - params.phase2_rounds
        else:
            self.fixed_t1 = cfg.rounds // 2
        #: auto: switch after this round at the latest
        self.latest_t1 = params.phase1_rounds if params.phase1_rounds is not None else cfg.rounds - 1
        self.shared_filters = params.filter_shared and params.coordinators and params.two_phase
        self.use_type_a = params.coordinators and params.two_phase

    @classmethod
    def paper_setup(cls, dataset: DatasetInfo) -> dict[str, Any]:
        """Sec. 5.1: T = 100, E = 5, B = 40, SGD with momentum 0.9 and weight decay 1e-5, the rate
        decayed by 0.99 a round, Dir(0.1), local test sets matched to the training distribution;
        FMNIST: 100 clients, participation 0.2, rate 0.01; CIFAR (and other colour images): 20
        clients, 0.4, 0.001."""
        common = {
            "rounds": 100,
            "train.local_epochs": 5,
            "train.batch_size": 40,
            "train.momentum": 0.9,
            "train.weight_decay": 1e-5,
            "train.lr_decay": 0.99,
            "data.partition": "dirichlet:0.1",
            "data.test_mode": "matched",
        }
        if dataset.channels == 3:
            return {**common, "model": "cnn3p2_cifar", "clients": 20, "participation": 0.4, "train.lr": 0.001}
        return {**common, "model": "cnn3p2_fmnist", "clients": 100, "participation": 0.2, "train.lr": 0.01}

    @classmethod
    def setup_sources(cls, dataset: DatasetInfo) -> dict[str, Source]:
        hyper = ["rounds", "clients", "participation", "train.lr", "train.lr_decay", "train.local_epochs"]
        hyper += ["train.batch_size", "train.momentum", "train.weight_decay"]
        return {
            **dict.fromkeys(hyper, Stated("Sec. 5.1, Hyperparameters")),
            "data.partition": Stated("Sec. 5.1, Statistically heterogeneous settings; Table 1 (Dir 0.1)"),
            "data.test_mode": Stated("Sec. 5.1, Metric: each local test set follows its training set"),
            "model": Stated("Sec. 5.1, Backbones"),
        }

    @classmethod
    def check(cls, cfg: ExperimentConfig, params: Fed3p2Config) -> None:
        uses_type_a = params.coordinators and params.two_phase
        uses_type_b = uses_type_a and params.filter_shared
        if uses_type_a and params.num_type_a > cfg.clients:
            raise ConfigError(
                f"Fed3+2p cannot have more Type-A coordinators ({params.num_type_a}) than clients ({cfg.clients})."
            )
        if uses_type_b and params.num_type_b > cfg.clients:
            raise ConfigError(
                f"Fed3+2p cannot have more Type-B groups ({params.num_type_b}) than clients ({cfg.clients})."
            )
        if params.phase_switch == "auto" and params.two_phase and cfg.data.val_fraction <= 0:
            raise ConfigError(
                "Fed3+2p's automatic phase switch needs validation parts: set data.val_fraction (e.g. 0.1)."
            )
        for name in ("phase1_rounds", "phase2_rounds"):
            value = getattr(params, name)
            if value is not None and value > cfg.rounds:  # at least 0: declared with the setting
                raise ConfigError(
                    f"Fed3+2p's {name} must be between 0 and the rounds ({cfg.rounds}), not {value}."
                )
        t1, t2 = params.phase1_rounds, params.phase2_rounds
        if t1 is not None and t2 is not None and t1 + t2 != cfg.rounds:
            raise ConfigError(
                f"Fed3+2p's phases ({t1} + {t2} rounds) must add up to the rounds ({cfg.rounds}); "
                f"run {t1 + t2} rounds (--rounds {t1 + t2})."
            )
        if t2 is not None and params.phase_switch == "auto":
            raise ConfigError("Fed3+2p's automatic phase switch decides the phases; give no phase2_rounds.")
        if params.chain_steps is not None and params.chain_epochs is not None:
            raise ConfigError("Fed3+2p's chain update is chain_epochs or chain_steps, not both.")
        if cfg.privacy.clip != "none":
            cls._check_private(params)

    @staticmethod
    def _check_private(params: Fed3p2Config) -> None:
        """What client-level DP (:meth:`private_aggregate`) cannot protect or account, refused."""
        if params.coordinators and params.two_phase and params.chain_sampling != "global":
            raise ConfigError(
                f"Under client-level DP Fed3+2p's chains must hold the round's sampled clients "
                f"(chain_sampling=global), the sampling the accountant models, not {params.chain_sampling}."
            )
        if params.phase_switch == "auto" and params.two_phase:
            raise ConfigError(
                "Fed3+2p's automatic phase switch reads every client's validation accuracy, which client-level "
                "DP does not release: use phase_switch=fixed."
            )
        if params.server_denominator != "round" and params.coordinators:
            raise ConfigError(
                "Under client-level DP Fed3+2p weighs each chain's clipped change equally (the clients' data "
                "sizes are private), so server_denominator does not apply: leave it round."
            )

    @staticmethod
    def phase(state: Fed3p2State, rnd: int) -> int:
        return 1 if state.t1 is None or rnd <= state.t1 else 2

    def phase_lr(self, state: Fed3p2State, rnd: int) -> float:
        """The schedule restarts from the initial rate when phase 2 begins."""
        return self.lr(rnd if state.t1 is None or rnd <= state.t1 else rnd - state.t1)

    def wants_validation(self, state: Fed3p2State, rnd: int) -> bool:
        return self.auto and state.t1 is None

    def observe_validation(self, state: Fed3p2State, rnd: int, accuracy: float) -> Fed3p2State:
        """The automatic switch: phase 1 ends when the GM's smoothed validation accuracy has not
        improved by ``switch_delta`` for ``switch_patience`` rounds (or at the latest round allowed)."""
        beta = self.params.switch_smoothing
        smoothed = (
            accuracy if state.smoothed_val is None else beta * state.smoothed_val + (1 - beta) * accuracy
        )
        improved = smoothed > state.best_val + self.params.switch_delta
        best = smoothed if improved else state.best_val
        since = 0 if improved else state.since_best + 1
        t1 = rnd if since >= self.params.switch_patience or rnd >= self.latest_t1 else None
        return dataclasses.replace(state, best_val=best, smoothed_val=smoothed, since_best=since, t1=t1)

    # ---------------------------------------------------------------------------------------- server
    def init(self, ctx: ServerContext) -> Fed3p2State:
        counts = self._label_counts = ctx.clients.label_counts
        grouped = self._private_counts(ctx) if ctx.private_rows is not None and self.use_type_a else counts
        type_a = type_a_grouping(grouped, self.params.num_type_a) if self.use_type_a else None
        type_b = type_b_grouping(grouped, self.params.num_type_b) if self.shared_filters else None
        groups = len(type_b.groups) if type_b is not None else 0
        gm = ctx.init_weights.select(GLOBAL_PARTS)
        filters: tuple[ModelWeights | None, ...] = (None,) * groups
        if ctx.private_rows is not None:  # a private release needs the filters its uploads start from
            filters = tuple(ctx.fresh_part("filter", f"fed3p2/filter/{g}") for g in range(groups))
        return Fed3p2State(
            0,
            gm,
            type_a,
            type_b,
            filters,
            self.fixed_t1,
            data_size=int(sum(ctx.clients.train_sizes)),
        )

    @staticmethod
    def _private_counts(ctx: ServerContext) -> Any:
        """Under client-level DP, what the groupings read instead of the clients' label counts: each
        client's label distribution released once with noise (``ServerContext.private_rows``),
        negative entries cut to 0, as one client's weight of counts (the data sizes are private too);
        a client whose noised row has nothing left counts as uniform."""
        import numpy as np

        counts = ctx.clients.label_counts.astype(np.float64)
        dist = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        assert ctx.private_rows is not None
        noised = np.maximum(ctx.private_rows("fed3p2/labels", dist), 0.0)
        total = noised.sum(axis=1, keepdims=True)
        uniform = np.full_like(noised, 1.0 / noised.shape[1])
        return np.where(total > 0, noised / np.where(total > 0, total, 1.0), uniform)

    def plan(self, state: Fed3p2State, rnd: int, sampled: Sequence[int]) -> list[Job]:
        lr = self.phase_lr(state, rnd)
        if not self.params.two_phase:
            payload: Any = JointPayload(state.gm, lr)
            return [Job((c,), payload, pinned=True) for c in sampled]
        if self.phase(state, rnd) == 1:
            if state.type_a is None:  # coordinators=false: plain parallel FedAvg
                return [Job((c,), WeightsPayload(state.gm, lr)) for c in sampled]
            chain = ChainPayload(state.gm, lr)
            jobs = []
            for c, members in enumerate(self.chains(state.type_a, rnd, sampled)):
                if members:  # in a seeded random order (Eq. 6-7)
                    order = rng.generator(self.cfg.seed, "fed3p2/order", rnd, c).permutation(list(members))
                    jobs.append(Job(tuple(int(k) for k in order), chain))
            return jobs
        frozen = state.gm.select(FROZEN_PARTS)
        if state.type_b is None:
            personal = Phase2Payload(frozen, -1, None, lr)
            return [Job((c,), personal, pinned=True) for c in sampled]
        group_of = state.type_b.assignment
        by_group = {
            g: Phase2Payload(frozen, g, state.group_filters[g], lr)
            for g in sorted({int(group_of[c]) for c in sampled})
        }
        return [Job((c,), by_group[int(group_of[c])], pinned=True) for c in sampled]

    def chains(self, type_a: Grouping, rnd: int, sampled: Sequence[int]) -> list[tuple[int, ...]]:
        """The clients of each chain of round ``rnd`` (unordered), as ``chain_sampling`` reads Step
        3 (see the module docstring); a chain may be empty (``global``)."""
        mode = self.params.chain_sampling
        if mode == "global":  # each coordinator's members among the round's sampled clients
            chosen = set(sampled)
            return [tuple(k for k in members if k in chosen) for members in type_a.groups]
        if mode == "all":
            return list(type_a.groups)
        if mode == "coordinators":  # whole coordinators, in a seeded order, until rho N train
            order = rng.generator(self.cfg.seed, "fed3p2/coordinators", rnd).permutation(len(type_a.groups))
            taken: set[int] = set()
            for c in order:
                if sum(len(type_a.groups[k]) for k in taken) >= self.cfg.clients_per_round:
                    break
                taken.add(int(c))
            return [members if c in taken else () for c, members in enumerate(type_a.groups)]
        # regroup: the sampled clients, split afresh into balanced-KL chains (Eq. 5 on them alone)
        clients = list(sampled)
        groups = type_a_grouping(self._label_counts[clients], min(self.params.num_type_a, len(clients)))
        return [tuple(clients[i] for i in g) for g in groups.groups]

    def continue_chain(self, payload: Any, prev: ClientResult) -> Any:
        """The next client in a coordinator's chain starts from the previous one's weights (Eq. 7)
        and, when momentum carries along the chain, its momentum buffers."""
        nxt = super().continue_chain(payload, prev)
        return dataclasses.replace(nxt, momentum=prev.extra) if isinstance(nxt, ChainPayload) else nxt

    def _logged_kl(self, state: Fed3p2State, results: Sequence[JobResult]) -> Fed3p2State:
        """``state`` with the round's chain_kl and round_kl (a measurement for the log: the
        algorithm never reads them)."""
        chains = [jr.job.clients for jr in results]
        if not chains:
            return state
        kl = group_kl(self._label_counts, chains)
        union = group_kl(self._label_counts, [tuple(c for ch in chains for c in ch)])
        return dataclasses.replace(state, chain_kl=float(kl.mean()), round_kl=float(union[0]))

    def private_aggregate(
        self, state: Fed3p2State, rnd: int, results: Sequence[JobResult], release: Release
    ) -> Fed3p2State:
        """The round under client-level DP (docs/algorithms.md, "Privacy"), every unit released even
        where none of its clients trained. Phase 1: each coordinator's chain is one unit, its change
        W^c - W(t) clipped to C; a client reaches only its coordinator's chain, but moves that
        chain's clipped change to another vector of norm at most C, so the unit's sensitivity is 2C;
        the chains' sum is divided by the number of coordinators (each chain weighs the same: Eq. 4's
        |D^c| / |D| would read the clients' private data sizes). Without coordinators, each client's
        upload is a unit, over the expected cohort (DP-FedAvg). Phase 2: each Type-B group's filter
        is a unit of its members' uploads over the group's expected sampled members (Eq. 11 with a
        fixed denominator), from the group's filter as sent; the P-heads stay on their clients."""
        finals = [jr.final.weights for jr in results if jr.final.weights is not None]
        if self.phase(state, rnd) == 1:
            state = self._logged_kl(state, results)
            if state.type_a is not None:
                gm = release.noised_mean(0, state.gm, finals, float(len(state.type_a.groups)), sensitivity=2.0)
            else:
                gm = release.noised_mean(0, state.gm, finals, release.expected(len(self.cfg.training_clients)))
            return dataclasses.replace(state, rnd=rnd, gm=gm)
        if state.type_b is None:  # personal filters: nothing leaves a client
            return dataclasses.replace(state, rnd=rnd)
        group_of = state.type_b.assignment
        filters = []
        for g, members in enumerate(state.type_b.groups):
            base = state.group_filters[g]
            assert base is not None, "init gives each group its fresh filter under client-level DP"
            mine = [jr.final.weights for jr in results if group_of[jr.final.client] == g and jr.final.weights is not None]
            filters.append(release.noised_mean(1 + g, base, mine, release.expected(len(members))))
        return dataclasses.replace(state, rnd=rnd, group_filters=tuple(filters))

    def aggregate(self, state: Fed3p2State, rnd: int, results: Sequence[JobResult]) -> Fed3p2State:
        if self.phase(state, rnd) == 1:
            state = self._logged_kl(state, results)
            finals = [jr.final.weights for jr in results]
            assert all(w is not None for w in finals)
            if state.type_a is not None:
                # Eq. 8: DeltaW^c = W(t) - W^c; Eq. 4 with this round's |D^c| / |D|
                sizes = [jr.num_samples for jr in results]
                total = sum(sizes) if self.params.server_denominator == "round" else state.data_size
                deltas = [subtract(state.gm, w) for w in finals if w is not None]
                gm = apply_updates(state.gm, deltas, [n / total for n in sizes])
            else:
                gm = average_uploads(results)
            return dataclasses.replace(state, rnd=rnd, gm=gm)
        if state.type_b is None:
            return dataclasses.replace(state, rnd=rnd)
        filters = list(state.group_filters)
        group_of = state.type_b.assignment
        for g in range(len(filters)):
            mine = [jr.final for jr in results if group_of[jr.final.client] == g]
            if mine:  # Eq. 11: the group's filter, weighted by its sampled clients' data
                uploads = [r.weights for r in mine if r.weights is not None]
                filters[g] = weighted_mean(uploads, [r.num_samples for r in mine])
        return dataclasses.replace(state, rnd=rnd, group_filters=tuple(filters))

    def evaluation(self, state: Fed3p2State) -> Evaluation:
        personal = not self.params.two_phase or (state.rnd > 0 and self.phase(state, state.rnd) == 2)
        group_of = tuple(int(g) for g in state.type_b.assignment) if state.type_b is not None else None
        return Fed3p2Evaluation(Fed3p2Eval(state.gm, personal, group_of, state.group_filters))

    def round_scalars(self, state: Fed3p2State, rnd: int) -> dict[str, float]:
        out = {"phase": float(self.phase(state, rnd))}
        if self.phase(state, rnd) == 1 and state.chain_kl is not None and state.round_kl is not None:
            out.update(chain_kl=state.chain_kl, round_kl=state.round_kl)
        if state.type_a is not None:
            out["type_a_objective"] = state.type_a.objective
        if state.type_b is not None:
            out["type_b_objective"] = state.type_b.objective
        return out

    def round_texts(self, state: Fed3p2State, rnd: int) -> dict[str, str]:
        def describe(g: Grouping) -> str:
            lines = [f"objective {g.objective:.6f}", ""]
            lines += [f"- group {k}: {', '.join(map(str, members))}" for k, members in enumerate(g.groups)]
            return "\n".join(lines)

        out = {}
        if rnd == 1 and state.type_a is not None:
            out["type_a_groups"] = describe(state.type_a)
        if state.t1 is not None and rnd == state.t1 + 1 and state.type_b is not None:
            out["type_b_groups"] = describe(state.type_b)
        return out

    # ---------------------------------------------------------------------------------------- client
    # Kept on the client's home worker: its P-head and, when filters are personal, its filter; both
    # start freshly initialised (seeded by client).
    @staticmethod
    def _phead(ctx: ClientContext) -> ModelWeights:
        return ctx.kept(("phead",), fresh="fed3p2/phead")

    @staticmethod
    def _filter(ctx: ClientContext, payload_filter: ModelWeights | None, group: int) -> ModelWeights:
        if group < 0:  # personal filter
            return ctx.kept(("filter",), fresh="fed3p2/filter/client")
        return payload_filter if payload_filter is not None else ctx.fresh("filter", f"fed3p2/filter/{group}")

    def update(self, ctx: ClientContext, payload: Any) -> Update:
        """Each payload kind's local update, described once (:class:`Update`): one-by-one training
        (:meth:`local_update`) and batched training (:meth:`batch_update`) both carry it out."""
        from raysim.toolkit.train import cross_entropy, personal_cross_entropy

        p = self.params
        if isinstance(payload, WeightsPayload):  # phase 1 without coordinators: as FedAvg
            return Update(payload.weights, GLOBAL_PARTS, cross_entropy, upload=GLOBAL_PARTS)
        if isinstance(payload, ChainPayload):  # phase 1, in a coordinator's chain, W^c from the one before
            return Update(
                payload.weights, GLOBAL_PARTS, cross_entropy, upload=GLOBAL_PARTS, epochs=p.chain_epochs,
                steps=p.chain_steps, momentum=payload.momentum, carry_momentum=p.chain_momentum == "carry",
            )  # fmt: skip
        if isinstance(payload, JointPayload):  # two_phase=false: W(t) and the client's own P-head
            start = payload.weights.merged(self._phead(ctx))
            return Update(start, (*GLOBAL_PARTS, "phead"), _joint_loss, keep=("phead",), upload=GLOBAL_PARTS)
        assert isinstance(payload, Phase2Payload)  # the filter and P-head on the frozen extractor and head
        shared = payload.group >= 0  # the group's filter goes up; a personal one stays here
        start = payload.frozen.merged(self._filter(ctx, payload.filter, payload.group)).merged(self._phead(ctx))
        return Update(
            start, ("filter", "phead"), personal_cross_entropy,
            keep=("phead",) if shared else ("filter", "phead"), upload=("filter",) if shared else (),
        )  # fmt: skip

    def local_update(self, ctx: ClientContext, payload: Any) -> ClientResult:
        u = self.update(ctx, payload)
        ctx.load(u.start)
        stats = ctx.train(u.parts, payload.lr, epochs=u.epochs, steps=u.steps, loss_fn=u.loss, momentum=u.momentum)
        return u.finish(ctx, stats, ctx.weights(u.parts))

    def batch_update(self, ctxs: Sequence[ClientContext], payloads: Sequence[Any]) -> list[ClientResult]:
        """:meth:`local_update` for each of ``ctxs``, trained together where they carry out one
        update from one payload, each from its own start: in phase 1 the round's clients from W(t)
        without coordinators, or the k-th clients of several chains, each from its chain's W^c (and
        momentum when it carries); in phase 2 one Type-B group's clients (or all, with personal
        filters), each from its filter and P-head on the frozen extractor; with two_phase=false,
        each from W(t) and its own P-head."""
        from raysim.toolkit.context import ClientContext

        first = payloads[0]
        chains = all(isinstance(q, ChainPayload) and q.lr == first.lr for q in payloads)
        if not chains and any(q is not first for q in payloads):
            return [self.local_update(c, q) for c, q in zip(ctxs, payloads, strict=True)]
        updates = [self.update(ctx, q) for ctx, q in zip(ctxs, payloads, strict=True)]
        u = updates[0]
        ctxs[0].load(u.start)
        trained = ClientContext.train_together(
            ctxs, u.parts, first.lr, loss_fn=u.loss, epochs=u.epochs, steps=u.steps,
            starts=[v.start for v in updates], momenta=[v.momentum for v in updates],
        )  # fmt: skip
        return [v.finish(ctx, stats, w) for v, ctx, (stats, w) in zip(updates, ctxs, trained, strict=True)]


class Fed3p2Evaluation(Evaluation):
    """A :class:`Fed3p2Eval`: the global model is its ``gm``; a client's personal model (once
    there are local models) is the global body with its group's filter and its P-head, and predicts
    with the P-head."""

    payload: Fed3p2Eval

    def global_model(self, algo: Fed3p2, model: SplitModel) -> SplitModel | None:
        return Evaluation(self.payload.gm).global_model(algo, model)

    def personal_model(self, algo: Fed3p2, ctx: ClientContext) -> SplitModel | None:
        ev = self.payload
        if not ev.personal:
            return None
        if not algo.params.two_phase:
            ctx.load(ev.gm.merged(algo._phead(ctx)))
            return ctx.model
        group = ev.group_of[ctx.cid] if ev.group_of is not None else -1
        group_filter = ev.group_filters[group] if group >= 0 else None
        ctx.load(
            ev.gm.select(FROZEN_PARTS)
            .merged(algo._filter(ctx, group_filter, group))
            .merged(algo._phead(ctx))
        )
        return ctx.model

    def forward(self, algo: Fed3p2, model: SplitModel) -> Any:
        return model.personal_forward


def _joint_loss(model: SplitModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """two_phase=false: cross-entropy of the G-head plus that of the P-head (choice)."""
    import torch.nn.functional as F

    z = model.filter(model.extractor(x))
    return F.cross_entropy(model.head(z), y) + F.cross_entropy(model.phead(z), y)


__all__ = ["Fed3p2", "Fed3p2Config"]
