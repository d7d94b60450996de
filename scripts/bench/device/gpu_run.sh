#!/usr/bin/env bash
# The GPU checks of a lent device machine (docs/benchmarks.md), in one call of the device tool:
#   bash scripts/bench/device/gpu_run.sh          (carry .whl, made here by build_kit.sh)
# Unpacks the kit's slim Ray 2.60.0 (+ jsonschema and its dependencies, which the device image lacks)
# into $SITE and Fashion-MNIST into data/FashionMNIST/raw, then runs the GPU tests,
# clients_per_second.py (mlp_fcd and cnn3p2_fmnist, the cross-device regime's one-step clients) and
# gpu_share.py (and with STEPS naming it, the `batched` step below); each step's output goes to
# $OUT/<step>.log, and a failed step does not stop the rest.
# Overridable: PY, SITE, OUT, DEVICE (cuda), LAYOUTS, ROUNDS (6), STEPS, TOTAL (s: the share step gets what is left of it).
set -u
cd "$(dirname "$0")/../../.."
ROOT=$(pwd); KIT=$ROOT/.whl
PY=${PY:-python3}; SITE=${SITE:-/tmp/site}; OUT=${OUT:-/tmp/out}; DEVICE=${DEVICE:-cuda}
LAYOUTS=${LAYOUTS:-cpu:16 gpu:1 gpu:5 gpu:10}; ROUNDS=${ROUNDS:-6}; TOTAL=${TOTAL:-430}
STEPS=${STEPS:-setup test cps_mlp cps_cnn share}
for s in $STEPS; do
  case " setup test cps_mlp cps_cnn batched share " in *" $s "*) ;;
    *) echo "gpu_run.sh: STEPS names setup, test, cps_mlp, cps_cnn, batched and share, not '$s'" >&2; exit 2 ;; esac
done
mkdir -p "$OUT" "$SITE"
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
export RAYSIM_CACHE_DIR=${RAYSIM_CACHE_DIR:-/tmp/raysim-cache}

step() {  # step NAME TIMEOUT CMD...: run, tee into $OUT/NAME.log, never stop the script
  local name=$1 t=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name: $* (timeout ${t}s) $(date +%T)" | tee "$OUT/$name.log"
  local s=$SECONDS
  timeout -k 15 "$t" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - s)) s" | tee -a "$OUT/$name.log"
}

setup() {
  set -e
  "$PY" - "$KIT" "$SITE" "$ROOT/data/FashionMNIST/raw" <<'PYEOF'
import glob, lzma, os, shutil, sys, tarfile, time, zipfile
kit, site, raw = sys.argv[1:]
t = time.time()
with tarfile.open(f"{kit}/ray-slim.tar.xz") as tf:
    tf.extractall(site, filter="tar")
for w in sorted(glob.glob(f"{kit}/*.whl")):
    zipfile.ZipFile(w).extractall(site)
    print("unpacked", os.path.basename(w))
os.makedirs(raw, exist_ok=True)
for f in sorted(glob.glob(f"{kit}/fmnist/*.xz")):
    dst = os.path.join(raw, os.path.basename(f)[:-3])
    if not os.path.exists(dst):
        with lzma.open(f) as src, open(dst + ".tmp", "wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(dst + ".tmp", dst)
    print(dst, os.path.getsize(dst))
print(f"unpacked in {time.time() - t:.1f} s")
PYEOF
  chmod +x "$SITE"/ray/core/src/ray/gcs/gcs_server "$SITE"/ray/core/src/ray/raylet/raylet 2>/dev/null || true
  set +e
  "$PY" -c "import ray, jsonschema; print('ray', ray.__version__, ray.__file__)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
  nvidia-smi -L; nproc; free -g | head -2; df -h /tmp | tail -1
}

export -f setup; export PY KIT SITE ROOT
step setup 120 bash -c setup
# pyproject's addopts (-ra --strict-markers -m 'not slow') need no plugin; -m gpu given later wins
step test 170 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_gpu.py
CPS="scripts/bench/clients_per_second.py --device $DEVICE --partition iid --federation 3000 --clients 200 --batch 5 10 20 --repeats 3"
step cps_mlp 90 "$PY" $CPS --model mlp_fcd
step cps_cnn 120 "$PY" $CPS --model cnn3p2_fmnist
# the cross-device workload end to end on one worker holding the GPU: one by one against batches of
# 16 clients (--batch-clients); not in the default STEPS
batched() {
  for per_round in 200 1000; do
    for model in mlp_fcd cnn3p2_fmnist; do
      for k in 1 16; do
        flags=(--batch-clients "$k")
        "$PY" scripts/run.py --algo fedavg --dataset fmnist --model $model --partition iid --clients 3000 \
          --participation "$(python3 -c "print($per_round / 3000)")" --rounds 3 --local-epochs 1 --batch-size 40 \
          --lr 0.01 --seed 0 --eval-every 0 --workers 1 --gpus-per-worker 1 --cpus-per-worker 4 \
          --no-progress --no-tensorboard -q --out "/tmp/batched-$model-$per_round-$k" "${flags[@]}" |
          tail -1 | "$PY" -c "import json, sys; d = json.loads(sys.stdin.read()); print(json.dumps({'model': '$model', 'per_round': $per_round, 'batch_clients': '$k', 'rounds_s': d['train_time_s'], 'updates_per_s': round(3 * $per_round / d['train_time_s'], 1), 'startup_s': d['startup_s'], 'gm_gtest': d['final']['gm_gtest']}))"
      done
    done
  done
}
export -f batched
step batched 300 bash -c batched
# shellcheck disable=SC2086
left=$((TOTAL - SECONDS)); [ "$left" -lt 90 ] && left=90
step share "$left" "$PY" scripts/bench/gpu_share.py --layouts $LAYOUTS --rounds "$ROUNDS"
echo "all steps done in $SECONDS s" | tee "$OUT/done.log"
