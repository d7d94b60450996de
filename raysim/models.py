"""Models with named parts: ``extractor | filter | head`` plus a personal head ``phead`` (PyTorch).

Every model is a :class:`SplitModel` whose parts are real ``nn.Module``s, so an algorithm can
freeze, share or keep personal any part by name. A model without a filter uses the
identity; ``phead`` has ``head``'s shape. Each builder takes the input shape and class count, so the
same model runs on the real dataset it was written for and on synthetic data of another size.

The builders are listed, with what they need of the input, in the model registry
(:data:`raysim.registry.MODELS`), which the driver reads without importing this module. Here too:
reading and writing a model's parts as the flat arrays of :class:`raysim.weights.ModelWeights`.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from raysim import torch_internals
from raysim.errors import ConfigError
from raysim.weights import PARTS, ModelWeights

__all__ = [
    "L2Normalize",
    "LossModule",
    "ModuleLayout",
    "SplitModel",
    "StrictBatchNorm1d",
    "batch_norm_mask",
    "statistics_mask",
    "WeightsLoader",
    "build_model",
    "float_tensors",
    "get_weights",
    "layout",
    "seeded_global_rng",
    "set_weights",
]


class SplitModel(nn.Module):
    """extractor -> filter -> head (the global path); ``phead`` is the personal classifier.

    ``feature_dim`` is the size of the extractor's output z (used by prototype and ETF methods);
    ``filter_dim`` is the size after the filter, the input of both heads.
    """

    def __init__(
        self,
        extractor: nn.Module,
        filter: nn.Module,
        head: nn.Linear,
        feature_dim: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.extractor = extractor
        self.filter = filter
        self.head = head
        self.phead = nn.Linear(head.in_features, head.out_features)
        self.feature_dim = feature_dim
        self.filter_dim = head.in_features
        self.num_classes = num_classes

    def part(self, name: str) -> nn.Module:
        if name not in PARTS:
            raise KeyError(f"unknown model part {name!r}")
        module: nn.Module = getattr(self, name)
        return module

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """z = extractor(x)."""
        out: torch.Tensor = self.extractor(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The global path: head(filter(extractor(x)))."""
        out: torch.Tensor = self.head(self.filter(self.extractor(x)))
        return out

    def personal_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The personal path: phead(filter(extractor(x)))."""
        out: torch.Tensor = self.phead(self.filter(self.extractor(x)))
        return out


class LossModule(nn.Module):
    """A loss of ``model`` as a module, ``loss_fn(model, x, y, *inputs)``, so that
    ``torch.func.functional_call`` can run it on substituted parameters (batched training, DP-SGD's
    per-example gradients)."""

    def __init__(self, model: SplitModel, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model, x, y, *inputs)


class L2Normalize(nn.Module):
    """x / max(||x||_2, eps) per row: features on the unit hypersphere (SphereFed, FedETF)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x, dim=1, eps=1e-12)


class StrictBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` that refuses a training batch of one sample in a sentence that says what
    to set. PyTorch refuses it too (one value per feature has no variance), with an error that names
    neither the batch nor the setting; a client whose size leaves one sample over for its last
    mini-batch meets it in whichever round it trains. The same layer otherwise: its state dict and
    numbers are ``nn.BatchNorm1d``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            raise ConfigError(
                "A BatchNorm1d layer cannot normalise a training batch of one sample (a client's last, "
                "partial mini-batch): set train.drop_last=true, or a train.batch_size that leaves no "
                "sample alone."
            )
        out: torch.Tensor = super().forward(x)
        return out


def _flat_dim(module: nn.Module, input_shape: Sequence[int]) -> int:
    """The width of ``module``'s output on one input of ``input_shape``, read in eval mode: a
    BatchNorm layer then neither moves its running statistics nor refuses a batch of one."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            return int(module(torch.zeros(1, *input_shape)).shape[1])
    finally:
        module.train(was)


def _conv_stack(
    in_ch: int,
    channels: Sequence[int],
    kernel: int,
    act: Callable[[], nn.Module],
    padding: int = 0,
    pool_after: Sequence[bool] | None = None,
    batch_norm: bool = False,
) -> list[nn.Module]:
    """Each convolution (with ``batch_norm``, then a BatchNorm2d), a max-pool 2 where ``pool_after``
    says (default: after every one), then ``act``. The papers' nets apply the activation before the
    pool; for a non-decreasing activation (ReLU) the two orders give the same numbers to the bit,
    forward and backward (the max of the activated values is the activated max, and the gradient
    reaches the same element, or is zero in both where the window's maximum is not positive), and
    after the pool the activation touches a quarter of the values, which saves 4-11 % of a training
    step on one thread (``scripts/bench/pool_order.py``)."""
    layers: list[nn.Module] = []
    pools = pool_after if pool_after is not None else [True] * len(channels)
    for out_ch, pool in zip(channels, pools, strict=True):
        layers.append(nn.Conv2d(in_ch, out_ch, kernel, padding=padding))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out_ch))
        if pool:
            layers.append(nn.MaxPool2d(2))
        layers.append(act())
        in_ch = out_ch
    return layers


def activation_before_pool(model: SplitModel) -> SplitModel:
    """A copy of ``model`` whose extractor applies each activation before the max-pool it follows,
    the papers' order (``_conv_stack`` builds the other): the same weights, for checking and timing
    the two orders against each other. A model with no max-pool followed by an activation is
    refused."""
    import copy

    other = copy.deepcopy(model)
    layers = list(other.extractor.children())
    pools = [i for i in range(len(layers) - 1) if isinstance(layers[i], nn.MaxPool2d)
             and isinstance(layers[i + 1], (nn.ReLU, nn.LeakyReLU))]  # fmt: skip
    if not pools:
        raise ValueError("The model's extractor has no max-pool followed by an activation to swap.")
    for i in pools:
        layers[i], layers[i + 1] = layers[i + 1], layers[i]
    other.extractor = nn.Sequential(*layers)
    return other


def _with_fc(
    convs: list[nn.Module], input_shape: Sequence[int], width: int, act: nn.Module, batch_norm: bool = False
) -> tuple[nn.Sequential, int]:
    """convs, flatten, then FC ``width`` (with ``batch_norm``, then a BatchNorm1d) + act: the
    extractor of FedFCD's and FedPAC's CNNs."""
    body = nn.Sequential(*convs, nn.Flatten())
    flat = _flat_dim(body, input_shape)
    norm: list[nn.Module] = [StrictBatchNorm1d(width)] if batch_norm else []
    return nn.Sequential(*convs, nn.Flatten(), nn.Linear(flat, width), *norm, act), width


def cnn3p2(
    input_shape: Sequence[int],
    num_classes: int,
    channels: Sequence[int],
    kernel: int,
    hidden: int,
    batch_norm: bool = False,
) -> SplitModel:
    """Fed3+2p's ConvNet (its paper's "Backbones"): convolutions with ReLU and max-pool as the
    extractor, FC ``hidden`` + ReLU as the filter, FC ``num_classes`` as the G-head. With
    ``batch_norm``, a BatchNorm after each convolution and after the filter's FC, before the ReLU."""
    pools = [True] * len(channels)
    if len(channels) == 3:  # the CIFAR net: conv-pool, conv-pool, conv
        pools[-1] = False
    extractor = nn.Sequential(
        *_conv_stack(input_shape[0], channels, kernel, nn.ReLU, pool_after=pools, batch_norm=batch_norm),
        nn.Flatten(),
    )
    d = _flat_dim(extractor, input_shape)
    filt = nn.Sequential(
        nn.Linear(d, hidden), *([StrictBatchNorm1d(hidden)] if batch_norm else []), nn.ReLU()
    )
    return SplitModel(extractor, filt, nn.Linear(hidden, num_classes), d, num_classes)


def cnn3p2_fmnist(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """conv 32, conv 64 (5x5, ReLU, max-pool 2) | FC 50 | FC 10."""
    return cnn3p2(input_shape, num_classes, (32, 64), 5, 50)


def cnn3p2_fmnist_bn(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """``cnn3p2_fmnist`` with batch normalisation, for FedBN: conv 32, conv 64 (5x5, each followed
    by a BatchNorm2d, then ReLU and max-pool 2) | FC 50, BatchNorm1d, ReLU | FC 10. A BatchNorm sits
    right after every convolution and every FC layer but the last, before the activation, as in
    FedBN's own models (Li et al., ICLR 2021; the authors' ``DigitModel`` and ``AlexNet``,
    med-air/FedBN ``nets/models.py``, read at commit 655f5f3). Its running statistics and affine
    parameters are entries of the parts' flat arrays like any other weight. A training batch of
    one sample cannot be normalised by the BatchNorm1d (:class:`StrictBatchNorm1d` refuses it):
    where a client's size leaves one sample over, set ``train.drop_last``."""
    return cnn3p2(input_shape, num_classes, (32, 64), 5, 50, batch_norm=True)


def cnn3p2_cifar(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """conv 32, 64, 64 (3x3, ReLU; max-pool after the first two) | FC 64 | FC 10/100."""
    return cnn3p2(input_shape, num_classes, (32, 64, 64), 3, 64)


def mlp_fcd(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """FedFCD's FMNIST MLP (as its paper gives it): 784 -> 100 ReLU | - | 100 -> 10."""
    n_in = 1
    for s in input_shape:
        n_in *= s
    extractor = nn.Sequential(nn.Flatten(), nn.Linear(n_in, 100), nn.ReLU())
    return SplitModel(extractor, nn.Identity(), nn.Linear(100, num_classes), 100, num_classes)


def cnn_fcd(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """FedFCD's CIFAR-10 CNN (McMahan et al. 2017): conv 32, conv 64 (5x5 'same', max-pool 2),
    FC 512 ReLU | - | FC 10. The padding is a choice: McMahan et al. do not give it, and PFLlib's
    FedAvgCNN (whose 'pat' split FedFCD's setup takes) pads 0, so its FC reads 64 x 5 x 5 = 1,600
    values on 32x32 inputs where this one reads 64 x 8 x 8 = 4,096. Kept, so that the published
    pages' numbers stay this model's."""
    convs = _conv_stack(input_shape[0], (32, 64), 5, nn.ReLU, padding=2)
    extractor, d = _with_fc(convs, input_shape, 512, nn.ReLU())
    return SplitModel(extractor, nn.Identity(), nn.Linear(d, num_classes), d, num_classes)


def _pac(
    input_shape: Sequence[int],
    num_classes: int,
    convs: Sequence[tuple[int, int, int]],
    batch_norm: bool = False,
) -> SplitModel:
    """Each conv ``(channels, kernel, padding)`` then a 2x2 max-pool and LeakyReLU (the authors
    apply LeakyReLU before the pool: the same numbers, as LeakyReLU is monotone), then FC 128.
    With ``batch_norm``, a BatchNorm2d right after each conv and a BatchNorm1d after the FC."""
    layers: list[nn.Module] = []
    in_ch = input_shape[0]
    for out_ch, kernel, padding in convs:
        layers.append(nn.Conv2d(in_ch, out_ch, kernel, padding=padding))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out_ch))
        layers += [nn.MaxPool2d(2), nn.LeakyReLU()]
        in_ch = out_ch
    extractor, d = _with_fc(layers, input_shape, 128, nn.LeakyReLU(), batch_norm=batch_norm)
    return SplitModel(extractor, nn.Identity(), nn.Linear(d, num_classes), d, num_classes)


def cnn_pac(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """FedPAC's (E)MNIST/FMNIST CNN (Xu et al., "Personalized Federated Learning with Feature
    Alignment and Classifier Collaboration"; the authors' ``CNN_FMNIST``, JianXu95/FedPAC
    ``models/cnn.py``): conv 16 5x5, conv 32 5x5 with padding 1 (each max-pooled, LeakyReLU), FC 128
    LeakyReLU | - | FC C; on 28x28 inputs the FC reads 32 x 5 x 5 = 800 values. (Before commit
    3833de0 the second conv had no padding, 512 values: results pages of code before then used it.)"""
    return _pac(input_shape, num_classes, ((16, 5, 0), (32, 5, 1)))


def cnn_pac_bn(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """``cnn_pac`` with batch normalisation, for FedBN: conv 16 5x5, BatchNorm2d, max-pool,
    LeakyReLU; conv 32 5x5 (padding 1), BatchNorm2d, max-pool, LeakyReLU; FC 128, BatchNorm1d,
    LeakyReLU | - | FC C. A BatchNorm sits right after every convolution and every FC layer but the
    last, before pooling and the activation, as in FedBN's own models (Li et al., ICLR 2021; the
    authors' ``DigitModel`` and ``AlexNet``, med-air/FedBN ``nets/models.py``, read at commit
    655f5f3). Its running statistics and affine parameters are entries of the extractor's flat
    array like any other weight. A training batch of one sample cannot be normalised by the
    BatchNorm1d (:class:`StrictBatchNorm1d` refuses it): where a client's size leaves one sample
    over, set ``train.drop_last``."""
    return _pac(input_shape, num_classes, ((16, 5, 0), (32, 5, 1)), batch_norm=True)


def cnn_pac_cifar(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """FedPAC's CIFAR/CINIC CNN (the authors' ``CifarCNN``): as ``cnn_pac`` plus a 3x3 conv 64 with
    padding 1, each of the three max-pooled, then FC 128 | - | FC C (64 x 3 x 3 = 576 values on
    32x32 inputs). (Before commit 3833de0 the third conv had neither padding nor pool.)"""
    return _pac(input_shape, num_classes, ((16, 5, 0), (32, 5, 1), (64, 3, 1)))


def vgg11(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """VGG-11 for 32x32 inputs (Simonyan and Zisserman 2015, as FedBABU and FedDr+ use it on
    CIFAR-10): the eight 3x3 convolutions with ReLU and five max-pools, then FC 512, ReLU, FC 512,
    ReLU | - | FC C. No batch normalisation."""
    cfg: list[int | str] = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    layers: list[nn.Module] = []
    in_ch = input_shape[0]
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(in_ch, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            in_ch = int(v)
    body = nn.Sequential(*layers, nn.Flatten())
    flat = _flat_dim(body, input_shape)
    extractor = nn.Sequential(
        *layers,
        nn.Flatten(),
        nn.Linear(flat, 512),
        nn.ReLU(inplace=True),
        nn.Linear(512, 512),
        nn.ReLU(inplace=True),
    )
    return SplitModel(extractor, nn.Identity(), nn.Linear(512, num_classes), 512, num_classes)


class _DepthwiseSeparable(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, in_ch, 3, stride, 1, groups=in_ch, bias=False),
            nn.BatchNorm2d(in_ch),
            nn.ReLU(inplace=True),
            nn.Conv2d(in_ch, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


def mobilenet(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """MobileNet (v1, Howard et al. 2017) for 32x32 inputs, as FedBABU and FedDr+ use it on
    CIFAR-100: a 3x3 conv 32 (stride 1), thirteen depthwise-separable blocks up to 1024 channels,
    global average pooling | - | FC C (d = 1024)."""
    plan = [64, (128, 2), 128, (256, 2), 256, (512, 2), 512, 512, 512, 512, 512, (1024, 2), 1024]
    layers: list[nn.Module] = [
        nn.Conv2d(input_shape[0], 32, 3, 1, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
    ]
    in_ch = 32
    for item in plan:
        out_ch, stride = item if isinstance(item, tuple) else (item, 1)
        layers.append(_DepthwiseSeparable(in_ch, out_ch, stride))
        in_ch = out_ch
    extractor = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return SplitModel(extractor, nn.Identity(), nn.Linear(1024, num_classes), 1024, num_classes)


def resnet18(input_shape: Sequence[int], num_classes: int) -> SplitModel:
    """torchvision's ResNet-18 adapted to 32x32 inputs (a 3x3 stride-1 first convolution, no
    max-pool), as FedFCD uses it on CIFAR-100: everything up to the global pooling | - | FC C (d = 512)."""
    import torchvision

    net = torchvision.models.resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(input_shape[0], 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    extractor = nn.Sequential(
        net.conv1,
        net.bn1,
        net.relu,
        net.layer1,
        net.layer2,
        net.layer3,
        net.layer4,
        net.avgpool,
        nn.Flatten(),
    )
    return SplitModel(extractor, nn.Identity(), nn.Linear(512, num_classes), 512, num_classes)


_GLOBAL_RNG = threading.RLock()  # re-entrant: an adapt_model may build a model itself


@contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """PyTorch's global generator seeded with ``seed`` for the block and restored after it, one
    thread at a time (a client worker that trains several jobs at once may build models in several
    threads; layers draw their initial parameters from the global generator)."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int,
    adapt: Callable[[SplitModel], SplitModel] | None = None,
    channels_last: bool = True,
) -> SplitModel:
    """Build the registered model ``name`` with parameters drawn from ``seed`` alone (the global
    generator is untouched); ``adapt`` (an algorithm's :meth:`~algorithms.base.Algorithm.adapt_model`)
    then changes its parts, drawing any new parameters from the same seeded generator.
    ``channels_last`` (``train.channels_last``): its 4-D tensors in that layout (:func:`to_channels_last`)."""
    from raysim.registry import MODELS

    spec = MODELS.get(name)
    spec.check_input(name, tuple(input_shape))
    with seeded_global_rng(seed):
        try:
            model: SplitModel = spec.build(tuple(input_shape), num_classes)
        except RuntimeError as e:  # e.g. an input too small for the convolutions
            raise ConfigError(
                f"The model {name} does not fit inputs of shape {tuple(input_shape)}: {e}."
            ) from None
        if adapt is not None:
            model = adapt(model)
    return to_channels_last(model) if channels_last else model


def to_channels_last(model: SplitModel) -> SplitModel:
    """``model`` with its 4-D tensors (convolution kernels) in the channels-last memory format.

    PyTorch's CPU kernels for convolution and max-pooling run on channels-last tensors without the
    per-call reorders of the NCHW path (``scripts/bench/layout.py``, figures in
    docs/benchmarks.md). Only the layout
    changes: every tensor keeps its shape and its values' logical order, so a part's flat array
    (``reshape``, ``view_as``) is what it was; the kernels sum in another order, so the numbers
    are not NCHW's to the bit. A model without 4-D tensors is returned as it is."""
    if any(t.dim() == 4 for t in model.parameters()):
        model = model.to(memory_format=torch.channels_last)
    return model


# --------------------------------------------------------------------------------------------------
# a model's parts as flat arrays


class ModuleLayout:
    """What a module's state holds, read once (:func:`layout`): its floating-point state tensors in
    the order a flat part lays them out, its modules and its parameters.

    A client's update loads its parts, trains them and reads them back: walking the module tree
    for that three times a part was a tenth of a one-step client's time. The layout is read again
    when the module tree may have changed: after any module, parameter or buffer is registered
    anywhere in the process, or when one of its tensors is no longer the one its module holds.
    ``floats`` is None for a module whose state dict is customised, which is read through
    ``state_dict`` every time. Where PyTorch's internals are off (:mod:`raysim.torch_internals`),
    nothing is kept: every layout is read anew, and its tensors through ``state_dict``."""

    __slots__ = ("floats", "modules", "params", "_generation", "_held")

    def __init__(self, module: torch.nn.Module) -> None:
        self._generation = torch_internals.registrations()  # first: a registration from now on is seen
        self.modules: tuple[torch.nn.Module, ...] = tuple(module.modules())
        self.params: tuple[torch.nn.Parameter, ...] = tuple(module.parameters())
        state = torch_internals.plain_state(module) if self._generation is not None else None
        self.floats: tuple[torch.Tensor, ...] | None = None if state is None else state[0]
        self._held: tuple[torch_internals.Held, ...] = () if state is None else state[1]

    def current(self) -> bool:
        """Whether the module tree is still what this layout read (never, where nothing is kept)."""
        return (
            self._generation is not None
            and self._generation == torch_internals.registrations()
            and torch_internals.still_held(self._held)
        )


_layouts: weakref.WeakKeyDictionary[torch.nn.Module, ModuleLayout] = weakref.WeakKeyDictionary()


def layout(module: torch.nn.Module) -> ModuleLayout:
    """``module``'s :class:`ModuleLayout`, read now or kept from before while it is current."""
    found = _layouts.get(module)
    if found is None or not found.current():
        found = ModuleLayout(module)
        if found._generation is not None:  # kept only where it can tell when it is stale
            _layouts[module] = found
    return found


def float_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The floating-point tensors of ``module``'s state (parameters and buffers such as batch-norm
    statistics), in the order a flat part lays them out: ``state_dict``'s order (each module's
    parameters, then its persistent buffers, then its children's, depth first), read without
    building a state dict (:class:`ModuleLayout`). A model whose modules customise their state dict
    is read through ``state_dict`` itself."""
    floats = layout(module).floats
    if floats is None:
        return [t for t in module.state_dict(keep_vars=True).values() if t.is_floating_point()]
    return list(floats)


_bn_masks: weakref.WeakKeyDictionary[torch.nn.Module, tuple[ModuleLayout, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def batch_norm_mask(model: SplitModel, part: str) -> np.ndarray:
    """Which entries of part ``part``'s flat array (:func:`get_part`) belong to batch-norm layers
    (their weight, bias, running mean and running variance; ``num_batches_tracked`` is an integer
    buffer and no entry): a read-only boolean array as long as the part's. Read once per part's
    module tree (:func:`layout`) and kept with it."""
    module = model.part(part)
    lay = layout(module)
    found = _bn_masks.get(module)
    if found is not None and found[0] is lay and lay.current():
        return found[1]
    held = {
        id(t)
        for m in lay.modules
        if torch_internals.is_batch_norm(m)
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    }
    tensors = float_tensors(module)
    mask = (
        np.concatenate([np.full(t.numel(), id(t) in held) for t in tensors]) if tensors else np.zeros(0, bool)
    )
    mask.flags.writeable = False
    _bn_masks[module] = (lay, mask)
    return mask


def statistics_mask(model: SplitModel, part: str) -> np.ndarray:
    """Which entries of part ``part``'s flat array (:func:`get_part`) are floating-point buffers, not
    parameters: the running statistics a BatchNorm layer estimates rather than learns (the
    running mean and variance). A boolean array as long as the part's."""
    module = model.part(part)
    params = {id(t) for t in module.parameters()}
    tensors = float_tensors(module)
    if not tensors:
        return np.zeros(0, bool)
    return np.concatenate([np.full(t.numel(), id(t) not in params) for t in tensors])


def get_part(model: SplitModel, part: str) -> np.ndarray:
    tensors = float_tensors(model.part(part))
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).to("cpu", torch.float32)
    return flat.numpy()


def _views_of(part: str, flat: np.ndarray, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Part ``part``'s flat array as one view per tensor of ``tensors``, shaped like it, in order
    (no copy of a C-contiguous float32 array; a read-only one, from the object store, is only read)."""
    total = sum(t.numel() for t in tensors)
    if flat.size != total:
        raise ValueError(f"part {part} has {total} values, got {flat.size}")
    if flat.dtype != np.float32 or not flat.flags.c_contiguous:
        flat = np.ascontiguousarray(flat, dtype=np.float32)
    if flat.flags.writeable:
        src = torch.from_numpy(flat)
    else:
        with warnings.catch_warnings():  # torch warns that it could write: it only reads here
            warnings.simplefilter("ignore", UserWarning)
            src = torch.from_numpy(flat)
    views = []
    offset = 0
    for t in tensors:
        n = t.numel()
        views.append(src[offset : offset + n].view_as(t))
        offset += n
    return views


def set_part(model: SplitModel, part: str, flat: np.ndarray) -> None:
    tensors = float_tensors(model.part(part))
    with torch.no_grad():
        for t, src in zip(tensors, _views_of(part, flat, tensors), strict=True):
            t.copy_(src)


class WeightsLoader:
    """:func:`set_weights` for a model that loads the same weights again and again (a worker's
    clients of one round all start from its payload): the copies from the weights' flat arrays into
    the model's tensors are laid out once per weights object, then made in one call
    (:func:`raysim.torch_internals.foreach_copy_`). The same values land in the same tensors as
    :func:`set_weights` puts them. Laid out anew for other weights, another model, or a part whose
    module tree changed (:func:`layout`); on a GPU, for a part whose state dict is customised, or
    where PyTorch's internals are off (:mod:`raysim.torch_internals`), it is :func:`set_weights`."""

    def __init__(self) -> None:
        self._weights: ModelWeights | None = None  # what the plan below loads (kept alive by it)
        self._model: SplitModel | None = None
        self._layouts: list[tuple[nn.Module, ModuleLayout]] = []
        self._dst: list[torch.Tensor] = []
        self._src: list[torch.Tensor] = []

    def load(self, model: SplitModel, weights: ModelWeights) -> None:
        if not (
            weights is self._weights
            and model is self._model
            and all(layout(module) is lay for module, lay in self._layouts)
        ) and not self._plan(model, weights):
            set_weights(model, weights)
            return
        with torch.no_grad():
            torch_internals.foreach_copy_(self._dst, self._src)

    def _plan(self, model: SplitModel, weights: ModelWeights) -> bool:
        """Lay out the copies of ``weights`` into ``model``; False where they are not laid out."""
        self._weights = self._model = None
        self._layouts, self._dst, self._src = [], [], []
        for name, flat in weights.items():
            module = model.part(name)
            lay = layout(module)
            if lay.floats is None or any(t.device.type != "cpu" for t in lay.floats):
                return False
            self._dst += lay.floats
            self._src += _views_of(name, flat, lay.floats)
            self._layouts.append((module, lay))
        self._weights, self._model = weights, model
        return True


def get_weights(model: SplitModel, parts: Sequence[str]) -> ModelWeights:
    return ModelWeights(**{p: get_part(model, p) for p in parts})


def set_weights(model: SplitModel, weights: ModelWeights) -> None:
    for name, arr in weights.items():
        set_part(model, name, arr)


def parameters_of(model: SplitModel, parts: Sequence[str]) -> list[torch.nn.Parameter]:
    """The parameters of ``parts``, in the order an optimizer over them holds them."""
    return [p for part in parts for p in layout(model.part(part)).params]


def parameter_views(model: SplitModel, flat: ModelWeights, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The trainable-parameter entries of ``flat`` (laid out as the model's parts: every floating
    tensor, parameters and buffers) as tensors shaped like the parameters of ``flat``'s parts, in
    the order ``module.parameters()`` gives them (the optimizer's order): e.g. a control variate
    or momentum buffers that travel as ModelWeights."""
    out: list[torch.Tensor] = []
    for part, arr in flat.items():
        src = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).to(device)
        offset = 0
        for t in float_tensors(model.part(part)):
            n = t.numel()
            if isinstance(t, torch.nn.Parameter):
                out.append(src[offset : offset + n].view_as(t))
            offset += n
    return out


def flat_from_parameters(model: SplitModel, parts: Sequence[str], tensors: Sequence[torch.Tensor]) -> ModelWeights:
    """The inverse of :func:`parameter_views`: one tensor per parameter of ``parts`` (in order) laid
    out as the parts' flat arrays, zero where the part holds a buffer."""
    out: dict[str, np.ndarray] = {}
    i = 0
    for part in parts:
        tensors_of_part = float_tensors(model.part(part))
        arr = np.zeros(sum(t.numel() for t in tensors_of_part), dtype=np.float32)
        pos = 0
        for t in tensors_of_part:
            n = t.numel()
            if isinstance(t, torch.nn.Parameter):
                arr[pos : pos + n] = tensors[i].detach().reshape(-1).cpu().numpy()
                i += 1
            pos += n
        out[part] = arr
    if i != len(tensors):
        raise ValueError(f"{len(tensors)} tensors for the {i} parameters of {tuple(parts)}")
    return ModelWeights(**out)
