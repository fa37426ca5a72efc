#!/usr/bin/env bash
# On the offline GPU machine, from the repository root with the wheels of scripts/fetch_gpu_wheels.sh in
# .whl: install them beside the image's packages (each wheel arrives as its unpacked contents in a
# .tar.xz, unpacked into one folder; a plain .whl there is pip-installed into it), then run every
# suite on CUDA (nox -s gpu_tests), which
# writes out/gpu/run-record.json, out/gpu/junit.xml and out/gpu/report.html. Extra args go to pytest.
# GPU_TESTS_INSTALL_ONLY=1 stops after the install (for a benchmark run in the same environment:
# `. scripts/gpu_tests.sh` then leaves PYTHONPATH set, and the caller's shell options as they were).
caller_options=$(set +o)
set -euo pipefail
dir=${WHEELS:-.whl}
site=${SITE:-/tmp/agc-site}
# DIR/tools (nox, import-linter, ...) is what the suites need; a benchmark call may leave it out
# (4.5 MB of the 64 MiB a GPU call carries).
wheels=() archives=()
for path in "$dir"/*.whl "$dir"/tools/*.whl; do if [ -e "$path" ]; then wheels+=("$path"); fi; done
for path in "$dir"/*.tar.xz "$dir"/tools/*.tar.xz; do if [ -e "$path" ]; then archives+=("$path"); fi; done
mkdir -p "$site"
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[@]}"
fi
for archive in ${archives[@]+"${archives[@]}"}; do tar -C "$site" -xJf "$archive"; done
# The project itself, for its pytest plugin's entry point (the code is imported from the checkout).
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
rm -rf build ./*.egg-info
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
# nox sessions call `python`; some images only have `python3`.
if ! command -v python >/dev/null 2>&1; then
  mkdir -p "$site/bin" && ln -sf "$(command -v python3)" "$site/bin/python" && export PATH="$site/bin:$PATH"
fi
if [ "${GPU_TESTS_INSTALL_ONLY:-0}" = 1 ]; then
  eval "$caller_options"  # a sourcing script's failing command must not end it from here on
  return 0 2>/dev/null || exit 0
fi
python3 -m nox -s gpu_tests -- "$@"
