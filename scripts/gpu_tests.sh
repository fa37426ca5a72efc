#!/usr/bin/env bash
# On the offline GPU machine, from the repository root with the wheels of scripts/fetch_gpu_wheels.sh in
# .whl: install them beside the image's packages, then run every suite on CUDA (nox -s gpu_tests), which
# writes out/gpu/run-record.json, out/gpu/junit.xml and out/gpu/report.html. Extra args go to pytest.
set -euo pipefail
dir=${WHEELS:-.whl}
site=${SITE:-/tmp/agc-site}
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$dir"/*.whl "$dir"/nox/*.whl
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m nox -s gpu_tests -- "$@"
