#!/usr/bin/env bash
# The kit gpu_run.sh unpacks on a lent GPU machine, which has PyTorch but not Ray:
#   bash scripts/bench/device/build_kit.sh [PYVER (312)] [OUTDIR (.whl)]
# Ray's wheel (79 MB) is over the device tool's 64 MiB carry limit: the kit holds its files for
# cpPYVER without what a raysim run never imports (jars, rllib, data, serve, train, tune, llm, the
# dashboard's web client; ray.tune is only the suites') and with the native binaries' symbols
# stripped (18 MB as tar.xz), the wheels of Ray's dependencies the device image lacks, and
# Fashion-MNIST's idx files from Debian's dataset-fashion-mnist (26 MB as xz). With SUITES=1 the
# kit keeps ray.tune, ray.train and ray.data (Tune imports both) and pydantic (ray.train's), so that scripts/sweep.py runs a suite there
# (suite_run.sh); the device image has the pyarrow and pandas Tune needs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
V=${1:-312}; OUT=${2:-.whl}; DL=/tmp/gpukit/dl$V; SUITES=${SUITES:-0}
case "$V" in 3[0-9][0-9]) ;; *) echo "build_kit.sh: PYVER is CPython's version without its dot, e.g. 312, not '$V'" >&2; exit 2 ;; esac
case "$SUITES" in 0) DROP="data train tune" ;; 1) DROP="" ;; *) echo "build_kit.sh: SUITES is 0 or 1, not '$SUITES'" >&2; exit 2 ;; esac
mkdir -p "$DL" "$OUT"
PIPARGS="--no-deps --only-binary=:all: --python-version ${V:0:1}.${V:1} --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $DL"
python3 -m pip download -q $PIPARGS ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
W=/tmp/gpukit/slim$V; rm -rf "$W"; mkdir -p "$W"
(cd "$W" && unzip -q "$DL"/ray-2.60.0-cp$V-*.whl)
rm -rf "$W"/ray/{jars,rllib,serve,llm} "$W"/ray/dashboard/client/build
for d in $DROP; do rm -rf "${W:?}/ray/$d"; done
strip --strip-unneeded "$W"/ray/_raylet.so
strip "$W"/ray/core/src/ray/gcs/gcs_server "$W"/ray/core/src/ray/raylet/raylet
find "$W" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$W" -cf - . | xz -9e -T8 > "$OUT/ray-slim.tar.xz"
if [ "$SUITES" = 1 ]; then  # ray.train, which Tune imports, needs pydantic
  python3 -m pip download -q $PIPARGS pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  cp "$DL"/pydantic-*.whl "$DL"/pydantic_core-*.whl "$DL"/annotated_types-*.whl "$DL"/typing_inspection-*.whl "$DL"/typing_extensions-*.whl "$OUT"/
fi
cp "$DL"/jsonschema-4.26.0-*.whl "$DL"/jsonschema_specifications-*.whl "$DL"/referencing-*.whl "$DL"/rpds_py-*.whl "$OUT"/
ls -la "$OUT"; du -sh "$OUT"
mkdir -p "$OUT/fmnist"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  name=$(basename "$f" .gz)
  [ -f "$OUT/fmnist/$name.xz" ] || gunzip -c "$f" | xz -9 -T2 > "$OUT/fmnist/$name.xz"
done
du -sh "$OUT"
