#!/usr/bin/env bash
# One command on one GPU (H200 target: under 8 minutes): throughput and MFU of the paper's 40M and
# 147M train steps (bf16, largest per-device batch that fits), the w = 8 sampler's share of a step at
# L = 4096, and 300 training steps of a 40M-width model on the embedded stdlib corpus; writes
# results/accelerators/<device>.md.
#
#   launch/fetch_wheels.sh              # ONLINE, once: wheels the offline image lacks -> .wheels/
#   launch/device_check.sh              # on the GPU machine (offline), from the repository root
#   launch/device_check.sh --dry_run    # anywhere, on CPU at toy sizes: checks the script's logic
#
# The offline image has jax 0.11.x (+ CUDA plugin), flax, optax, orbax-checkpoint, chex, tokenizers
# and matplotlib; grain, ml_collections, array-record and tensorboardX come from .wheels/ into a
# private folder (.deps/, nothing installed system-wide) and tokjax runs from this checkout.
# Env: WHEELS (default .wheels), PYTHON (default python3), TIME_LIMIT seconds (default 480),
# FORCE_WHEELS=1 (install the wheels even when the packages are present: tests that step).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-.wheels}"
DEPS="${DEPS:-.deps}"
TIME_LIMIT="${TIME_LIMIT:-480}"

echo "== 1/3 python packages"
missing=$("${PYTHON}" - <<'PY'
import importlib.util
need = {'grain': 'grain', 'ml_collections': 'ml_collections', 'array_record': 'array_record',
        'tensorboardX': 'tensorboardX', 'cloudpickle': 'cloudpickle', 'portpicker': 'portpicker'}
print(' '.join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
if [[ -n "${missing}" || "${FORCE_WHEELS:-0}" == 1 ]]; then
  echo "missing: ${missing}; installing from ${WHEELS}/ into ${DEPS}/"
  if ! ls "${WHEELS}"/*.whl > /dev/null 2>&1; then
    echo "error: no wheels in ${WHEELS}/; run launch/fetch_wheels.sh on a machine with network access" \
      "and copy ${WHEELS}/ here." >&2
    exit 2
  fi
  "${PYTHON}" -m pip install --quiet --no-index --no-deps --target "${DEPS}" "${WHEELS}"/*.whl
fi
# tokjax itself runs from this checkout (equivalent to `pip install --no-deps -e .`, without a build).
export PYTHONPATH="${PWD}:${PWD}/${DEPS}${PYTHONPATH:+:${PYTHONPATH}}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"

echo "== 2/3 environment"
"${PYTHON}" -c 'import jax, flax, optax, grain, ml_collections, tokjax
print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__)
print("devices:", jax.devices())'

echo "== 3/3 device check (limit ${TIME_LIMIT} s)"
timeout "${TIME_LIMIT}" "${PYTHON}" launch/device_check.py "$@"
