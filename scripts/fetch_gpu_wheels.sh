#!/usr/bin/env bash
# On a machine WITH network: download what an offline GPU machine (Python 3.12, CUDA 13, torch 2.11
# preinstalled) lacks to run `nox -s gpu_tests`: FlashInfer 0.6.13 with its two helpers in DIR, and
# in DIR/tools nox, jsonschema, import-linter and buildkite-sdk (its pipeline schema only, so without its
# dependencies) for the CI harness tests.
# Usage: scripts/fetch_gpu_wheels.sh [DIR]   (default DIR: .whl, ignored by git; carry it to the GPU machine)
set -euo pipefail
dir=${1:-.whl}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# The tools are unpinned: a fresh folder each time, or two versions of one package stop the install.
rm -rf "$dir/tools"
mkdir -p "$dir/tools"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$dir" flashinfer-python==0.6.13 apache-tvm-ffi==0.1.15.post2 nvidia-cudnn-frontend==1.32.0
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform any -d "$dir/tools" nox jsonschema import-linter
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/tools" buildkite-sdk
du -sh "$dir"
