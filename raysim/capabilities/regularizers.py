"""The capability of taking FedDr+'s Table 1 regularisers (:class:`Regularizable`), declared on an
algorithm's class.

With ``algo.regularizers=[prox|kd|ntd|ld|fd]`` the local loss becomes ``reg_beta`` times the
algorithm's own plus (1 - ``reg_beta``) times the named terms against the received global model
(``algo.reg_beta`` 0.9 as FedDr+'s Eq. 4, ``algo.reg_tau`` 3 for kd and ntd); the terms are in
:mod:`raysim.toolkit.distill`. An algorithm with the capability wraps its loss with :meth:`Regularizable.wrap`;
one without it takes none of these settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, assert_never

from raysim.capabilities.declared import Capability
from raysim.capabilities.settings import RegName, engine_settings
from raysim.config import ExperimentConfig
from raysim.weights import ModelWeights

if TYPE_CHECKING:
    from raysim.toolkit.context import ClientContext
    from raysim.toolkit.distill import Term
    from raysim.toolkit.train import LossFn


def term(name: RegName) -> Term:
    """The regulariser ``name``'s term (:mod:`raysim.toolkit.distill`). The names are one list,
    ``RegName`` (:mod:`raysim.capabilities.settings`), which ``algo.regularizers`` is checked
    against; mypy checks that this match gives every one of them a term."""
    from raysim.toolkit import distill

    match name:
        case "prox":
            return distill.prox_term
        case "kd":
            return distill.kd_term
        case "ntd":
            return distill.ntd_term
        case "ld":
            return distill.ld_term
        case "fd":
            return distill.fd_term
        case _:
            assert_never(name)


#: the config Regularizable.setting last read, and its answer
_last_setting: tuple[Any, Any] = (None, None)


@dataclass(frozen=True)
class Regularizable(Capability):
    """``regularizers = Regularizable()`` on an algorithm's class."""

    @staticmethod
    def setting(cfg: ExperimentConfig) -> tuple[tuple[RegName, ...], float, float]:
        """(names, beta, tau) of the added regularisers (none unless ``algo.regularizers``), read
        once per config (every client's update asks)."""
        global _last_setting
        read, setting = _last_setting  # one tuple: a pair from one config, whichever thread wrote it
        if read is not cfg:
            p = engine_settings(cfg.algo_params)
            setting = (tuple(p.regularizers), p.reg_beta, p.reg_tau)
            _last_setting = (cfg, setting)
        out: tuple[tuple[RegName, ...], float, float] = setting
        return out

    def wrap(
        self, cfg: ExperimentConfig, ctx: ClientContext, received: ModelWeights, parts: Sequence[str], loss_fn: LossFn
    ) -> LossFn:
        """``loss_fn`` with the run's added regularisers against ``received`` (the global model the
        client started from, already loaded in ``ctx.model``), ``parts`` being what trains; the
        loss itself when there are none (and for an algorithm without the capability)."""
        if not self.declared:
            return loss_fn
        names, beta, tau = self.setting(cfg)
        if not names:
            return loss_fn
        from raysim.toolkit.distill import RegContext, regularized
        from raysim.toolkit.train import proximal_anchor

        rc = RegContext(ctx.teacher(received), proximal_anchor(ctx.model, parts), tuple(parts), tau)
        return regularized(loss_fn, [term(n) for n in names], beta, rc)


__all__ = ["Regularizable", "term"]
