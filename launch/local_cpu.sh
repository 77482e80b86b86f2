#!/usr/bin/env bash
# Train on this machine's CPU, sharded over simulated devices (to try a mesh before renting one).
#
#   launch/local_cpu.sh                                   # configs/mesh_cpu8.py on 8 simulated devices
#   DEVICES=4 CONFIG=configs/default.py launch/local_cpu.sh --config.mesh.fsdp=2
#
# Extra arguments go to `python -m tokjax.train`. DEVICES=1 is a plain single-device run.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES="${DEVICES:-8}"
CONFIG="${CONFIG:-configs/mesh_cpu8.py}"
PYTHON="${PYTHON:-python}"
export JAX_PLATFORMS=cpu
# The device count must be set before jax starts; keep any flags the caller already has.
export XLA_FLAGS="--xla_force_host_platform_device_count=${DEVICES} ${XLA_FLAGS:-}"
exec "${PYTHON}" -m tokjax.train --config "${CONFIG}" --config.mesh.multihost=off "$@"
