#!/usr/bin/env bash
# On a machine WITH network: fetch vLLM's released Triton unified-attention kernel for the
# `vllm-triton` benchmark peer and kernel-suite case. Downloads the pinned vLLM wheel into a
# temporary folder and extracts ONLY its two Triton modules (the kernel and its helpers) into DIR;
# nothing else of vLLM is kept, and nothing of it is committed (DIR is ignored by git).
# Carry DIR to the GPU machine inside the checkout. attngroup.benchmarks.vllm_triton_peer loads it from
# VLLM_TRITON_KERNEL_DIR (default: .vllm-triton in the repository root).
# Usage: scripts/fetch_vllm_triton_kernel.sh [DIR]   (default DIR: .vllm-triton)
set -euo pipefail
version=0.34.0
dir=${1:-.vllm-triton}
modules=(vllm/v1/attention/ops/triton_unified_attention.py vllm/v1/attention/ops/triton_attention_helpers.py)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp" "vllm==$version"
python3 - "$tmp"/vllm-"$version"-*.whl "$dir" "$version" "${modules[@]}" <<'PY'
import pathlib, sys, zipfile
wheel, out, version, *modules = sys.argv[1:]
out = pathlib.Path(out)
out.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as archive:
    for module in modules:
        (out / pathlib.Path(module).name).write_bytes(archive.read(module))
(out / "VERSION").write_text(f"vllm=={version}\n")
print(f"extracted {', '.join(modules)} from {pathlib.Path(wheel).name} into {out}")
PY
