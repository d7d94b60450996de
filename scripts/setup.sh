#!/usr/bin/env bash
# Set raysim up on this machine, then (optionally) do one thing:
#   bash scripts/setup.sh          set up only
#   bash scripts/setup.sh run      set up, then a two-minute 100-client Fed3+2p run on Fashion-MNIST, local Ray
#   bash scripts/setup.sh test     set up, then ruff, mypy and the default test suite (CI runs it, then
#                                  the integration tests)
#   bash scripts/setup.sh integration   set up, then the integration tests the default suite leaves out
#   bash scripts/setup.sh lint     set up, then ruff and mypy
# Setup: a virtual environment in .venv, PyTorch, raysim with its dev extra, and Fashion-MNIST
# (Debian's dataset-fashion-mnist where apt is available, else torchvision's download into data/).
# It is idempotent: a second call only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
VENV=$ROOT/.venv

log() { printf '[setup] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python

stamp=$VENV/.raysim-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VPY" -m pip install -q --upgrade pip
  if ! "$VPY" -c "import torch, torchvision" 2>/dev/null; then
    # Pinned builds: on x86-64 a CUDA build (runs on the CPU too); on Arm a CPU build.
    if [ -n "${TORCH_SPEC:-}" ]; then spec=$TORCH_SPEC
    elif [ "$(uname -m)" = "aarch64" ]; then spec="torch==2.9.1 torchvision==0.24.1"
    else spec="torch==2.14.1 torchvision==0.29.1"; fi
    log "installing $spec"
    # shellcheck disable=SC2086
    "$VPY" -m pip install -q $spec
  fi
  log "installing raysim and its dependencies"
  "$VPY" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi

# Fashion-MNIST: the real idx files.
FMNIST_DEB=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST_DEB/train-images-idx3-ubyte.gz" ] && [ ! -f "$ROOT/data/FashionMNIST/raw/train-images-idx3-ubyte" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing Debian's dataset-fashion-mnist"
    (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) >/dev/null 2>&1 || log "apt-get could not install dataset-fashion-mnist"
  fi
  if [ ! -f "$FMNIST_DEB/train-images-idx3-ubyte.gz" ]; then
    log "downloading Fashion-MNIST with torchvision into data/"
    "$VPY" -c "import torchvision; torchvision.datasets.FashionMNIST('data', download=True)" || log "Fashion-MNIST download failed; runs on fmnist will say so"
  fi
fi

# Local Ray stays on loopback and reports nothing.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0

# Two test processes (pytest-xdist): most tests that start Ray wait on it, and the other process's
# tests use the time (RAYSIM_TEST_PROCESSES=0 runs them in this one); tests are handed out one at a
# time (--maxschedchunk 1): xdist's default first hands each process a quarter of its share, which
# put every long Ray test (sorted first) in one process while the other ran out of tests halfway.
run_tests() { exec "$VPY" -m pytest -q -n "${RAYSIM_TEST_PROCESSES:-2}" --maxschedchunk 1 "$@"; }

case "${1:-}" in
  "") log "ready: $VPY scripts/run.py --help" ;;
  run)
    shift
    # Fed3+2p on Fashion-MNIST with its paper setup (100 clients, Dir(0.1), participation 0.2), cut
    # to two minutes on two cores: the literal reading of Sec. 4.1 in phase 1 (every client of every
    # coordinator, one gradient step each, Eq. 9, momentum carried along the chain) for 11 rounds,
    # then 13 rounds of phase 2 at E = 2; lr 0.03
    exec "$VPY" scripts/run.py --algo fed3p2 --dataset fmnist --clients 100 --rounds 24 --lr 0.03 \
      --local-epochs 2 --eval-every 0 --set algo.phase1_rounds=11 --set algo.chain_sampling=all \
      --set algo.chain_steps=1 --set algo.chain_momentum=carry "$@" ;;
  test)
    shift
    "$VPY" -m ruff check raysim algorithms scripts tests
    "$VPY" -m mypy raysim algorithms
    run_tests "$@" ;;
  integration)
    shift
    # a real command end to end in processes of its own: a Ray, a cluster, a job, a suite
    run_tests -m integration "$@" ;;
  lint)
    "$VPY" -m ruff check raysim algorithms scripts tests
    exec "$VPY" -m mypy raysim algorithms ;;
  *) log "unknown action $1 (run | test | integration | lint)"; exit 2 ;;
esac
