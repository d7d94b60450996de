#!/usr/bin/env bash
# Suites on a lent machine's CPU cores, in one call of the device tool (carry .whl, made here by
# `SUITES=1 bash scripts/bench/device/build_kit.sh`, which keeps ray.tune):
#   bash scripts/bench/device/suite_run.sh SECONDS NAME "SWEEP ARGS" [NAME "SWEEP ARGS" ...]
# Unpacks the kit (gpu_run.sh's setup step), then runs each suite one after another with
# scripts/sweep.py into /tmp/suites/NAME, stopping the sweep in hand with SIGINT (Tune then saves its
# state and the suite its summary) once SECONDS have passed since the start; each suite directory
# comes back as $OUT/NAME.tar.gz (without the trials' checkpoints: an unfinished trial starts again),
# to publish here or to finish here with `sweep.py --resume`.
set -u
cd "$(dirname "$0")/../../.."
[ $# -ge 3 ] && [ $(( ($# - 1) % 2 )) -eq 0 ] || { echo "suite_run.sh: give SECONDS, then NAME and \"SWEEP ARGS\" pairs" >&2; exit 2; }
case "$1" in ''|*[!0-9]*) echo "suite_run.sh: SECONDS is a whole number of seconds, not '$1'" >&2; exit 2 ;; esac
END=$((SECONDS + $1)); shift
OUT=${OUT:-/tmp/out}; SITE=${SITE:-/tmp/site}; PY=${PY:-python3}
STEPS=setup OUT=$OUT SITE=$SITE PY=$PY bash scripts/bench/device/gpu_run.sh >/dev/null 2>&1 || true
tail -5 "$OUT/setup.log"
export PYTHONPATH=$SITE:$(pwd) RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAYSIM_CACHE_DIR=/tmp/raysim-cache
mkdir -p /tmp/suites
while [ $# -gt 0 ]; do
  name=$1; args=$2; shift 2
  left=$((END - SECONDS))
  [ "$left" -lt 30 ] && { echo "=== $name: not started, ${left} s left"; continue; }
  echo "=== $name: sweep.py suites/$name.yaml $args ($left s at most) $(date +%T)"
  # shellcheck disable=SC2086
  timeout -s INT -k 60 "$left" "$PY" scripts/sweep.py "suites/$name.yaml" --out "/tmp/suites/$name" --no-progress -q $args \
    > "/tmp/suites/$name.log" 2>&1
  echo "=== $name: exit $? $(date +%T)"; tail -3 "/tmp/suites/$name.log"
  cp "/tmp/suites/$name.log" "/tmp/suites/$name/sweep-device.log" 2>/dev/null
  tar -C /tmp/suites --exclude=checkpoint.pkl -czf "$OUT/$name.tar.gz" "$name"  # a resumed trial without its checkpoint starts again
done
nproc; lscpu | grep -m1 "Model name"
