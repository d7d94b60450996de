"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov and Morency, "Think Locally,
Act Globally: Federated Learning with Local and Global Representations", arXiv:2001.01523, 2020;
Algorithm 1): each client learns a local representation
and all clients share a global model on top of it. The mirror of FedPer (``algorithms/fedper.py``,
which shares the body and keeps the head).

- The representation, ``extractor`` and ``filter``, is local: it never leaves its client (kept on
  its home worker; the seeded initial body until the client first trains).
- The ``head`` (Algorithm 1's global parameters theta^g) is shared: each sampled client loads the
  received head over its own body, trains body and head together for E epochs with cross-entropy
  (Algorithm 1's local update of theta^l_m and theta^g), keeps its body and uploads its head; the
  server averages the heads by training-set size, theta^g <- sum_m n_m/n theta^g_m.
- No global model (``gm_*`` null): the shared head alone is no model. LM of client k = the current
  head over k's body, what the paper's "local test" scores (each device's model on its own test data).

The paper's "new devices" evaluation scores the global test set with the local models of the
existing devices together: the authors' code (pliang279/LG-FedAvg ``main_lg.py`` and
``models/test.py``, ``test_img_ensemble_all``, read at commit 8ee6a68) averages the outputs of
every client's model (and also takes their majority vote), and ``test_img_avg_all`` scores one
model whose every parameter is the mean of the clients' models. Neither is computed here; a
newcomer is scored as every shared-and-personal algorithm's is.

Choices: the heads are averaged by training-set size, as FedAvg averages; the authors'
``main_lg.py`` divides the sum of the round's global layers by their number, the same on the
equal-sized shards of their experiments. Their code starts every local model from a model FedAvg
trained first (its ``--load_fed``, which ``main_lg.py`` requires); here every client starts from
the seeded initial model (a FedAvg warm-up is not part of Algorithm 1). Their global layers are the
last ``num_layers_keep`` entries of each net's ``weight_keys`` list, which does not follow the
net's order everywhere: for the MNIST MLP they are its top layers, for ``CNNCifar`` (listed fc1,
fc2, fc3, conv2, conv1) ``--num_layers_keep 2`` shares the two convolutions and keeps every fully
connected layer local. Here the global part is the head, the model's last layer, as PFLlib's
LG-FedAvg shares it. The authors' "local test" figure takes, for each client, its round of best
test accuracy; LM here is read at every evaluation, as for every algorithm.
"""

from __future__ import annotations

from algorithms.base import register
from algorithms.personal import Pass, SharedAndPersonal
from raysim.weights import BODY


@register("lgfedavg")
class LGFedAvg(SharedAndPersonal):
    """Shared, averaged head; personal body (extractor and filter) on the home worker."""
    family = "split"

    has_global_model = False
    shared_parts = ("head",)
    personal_parts = BODY

    def passes(self) -> list[Pass]:
        """One pass of body and head, cross-entropy."""
        from raysim.toolkit.train import cross_entropy

        return [Pass((*BODY, "head"), cross_entropy)]


__all__ = ["LGFedAvg"]
