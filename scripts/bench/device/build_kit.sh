#!/usr/bin/env bash
# The kit gpu_run.sh unpacks on a lent GPU machine, which has PyTorch but not Ray:
#   bash scripts/bench/device/build_kit.sh [PYVER (312)] [OUTDIR (.whl)]
# Ray's wheel (79 MB) is over the device tool's 64 MiB carry limit: the kit holds its files for
# cpPYVER without what a raysim run never imports (jars, rllib, data, serve, train, tune, llm, the
# dashboard's web client; ray.tune is only the suites') and with the native binaries' symbols
# stripped (18 MB as tar.xz), the wheels of Ray's dependencies the device image lacks, and
# Fashion-MNIST's idx files from Debian's dataset-fashion-mnist (26 MB as xz).
set -euo pipefail
cd "$(dirname "$0")/../../.."
V=${1:-312}; OUT=${2:-.whl}; DL=/tmp/gpukit/dl$V
case "$V" in 3[0-9][0-9]) ;; *) echo "build_kit.sh: PYVER is CPython's version without its dot, e.g. 312, not '$V'" >&2; exit 2 ;; esac
mkdir -p "$DL" "$OUT"
PIPARGS="--no-deps --only-binary=:all: --python-version ${V:0:1}.${V:1} --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $DL"
python3 -m pip download -q $PIPARGS ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
W=/tmp/gpukit/slim$V; rm -rf "$W"; mkdir -p "$W"
(cd "$W" && unzip -q "$DL"/ray-2.60.0-cp$V-*.whl)
rm -rf "$W"/ray/{jars,rllib,data,serve,train,tune,llm} "$W"/ray/dashboard/client/build
strip --strip-unneeded "$W"/ray/_raylet.so
strip "$W"/ray/core/src/ray/gcs/gcs_server "$W"/ray/core/src/ray/raylet/raylet
find "$W" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$W" -cf - . | xz -9e -T8 > "$OUT/ray-slim.tar.xz"
cp "$DL"/jsonschema-4.26.0-*.whl "$DL"/jsonschema_specifications-*.whl "$DL"/referencing-*.whl "$DL"/rpds_py-*.whl "$OUT"/
ls -la "$OUT"; du -sh "$OUT"
mkdir -p "$OUT/fmnist"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  name=$(basename "$f" .gz)
  [ -f "$OUT/fmnist/$name.xz" ] || gunzip -c "$f" | xz -9 -T2 > "$OUT/fmnist/$name.xz"
done
du -sh "$OUT"
