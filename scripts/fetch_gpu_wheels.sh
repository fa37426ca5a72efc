#!/usr/bin/env bash
# On a machine WITH network: download what an offline GPU machine (Python 3.12, CUDA 13, torch 2.11
# preinstalled) lacks to run `nox -s gpu_tests`, at the versions of requirements/lock.txt: FlashInfer
# with its two helpers in DIR, and in DIR/tools nox, jsonschema, import-linter, coverage, pytest-cov (the
# runtime-coverage tests of check-deps; both without dependencies) and buildkite-sdk (its
# pipeline schema only, so without its dependencies) for the CI harness tests. FlashInfer's wheel
# (101 MB for 0.7.4) is over the 64 MiB a GPU call may carry, checkout included: every wheel
# travels as NAME.tar.xz, its unmodified contents xz-compressed (FlashInfer 26 MB, the others
# 13 MB where their wheels take 21), which scripts/gpu_tests.sh unpacks where pip would.
# Usage: scripts/fetch_gpu_wheels.sh [DIR]   (default DIR: .whl, ignored by git; carry it to the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
lock=requirements/lock.txt
pinned() {  # NAME -> NAME==VERSION as the lock has it
  grep -E "^$1==" "$lock" || { echo "error: $lock pins no $1" >&2; exit 2; }
}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# Fresh wheels each time: two versions of one package stop the install.
mkdir -p "$dir"
rm -rf "$dir"/*.whl "$dir"/*.tar.xz "$dir/tools"
mkdir -p "$dir/tools"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$dir" "$(pinned flashinfer-python)" "$(pinned apache-tvm-ffi)" "$(pinned nvidia-cudnn-frontend)"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform any -c "$lock" -d "$dir/tools" nox jsonschema import-linter
# nox runs gpu_tests and bench in the current interpreter (venv_backend="none") and imports no
# virtualenv: it and distlib, which only it needs, stay behind (6.2 MB of the 64 MiB a call carries).
rm -f "$dir"/tools/virtualenv-*.whl "$dir"/tools/distlib-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/tools" "$(pinned buildkite-sdk)"
# Without their dependencies: the image's own pytest stays the one that runs.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform any -d "$dir/tools" "$(pinned coverage)" "$(pinned pytest-cov)"
for wheel in "$dir"/*.whl "$dir"/tools/*.whl; do
  unpacked=$(mktemp -d)
  python3 -m zipfile -e "$wheel" "$unpacked"
  tar -C "$unpacked" -cf - . | xz -T0 -6 >"${wheel%.whl}.tar.xz"
  rm -rf "$unpacked" "$wheel"
done
du -sh "$dir"
