#!/usr/bin/env bash
# Train on one machine with several GPUs: one process drives every local GPU, no distributed setup.
#
#   launch/gpu_node.sh configs/default.py --config.mesh.fsdp=-1 --config.mesh.data=1
#   INSTALL=1 launch/gpu_node.sh configs/default.py     # first pip-install tokjax with CUDA jaxlib
#
# The first argument is the config file; the rest go to `python -m tokjax.train`. The mesh comes from
# the config (config.mesh.data/fsdp/tensor; the default data=-1 is plain data parallelism over all
# GPUs). config.data.batch_size is the global batch and must be a multiple of data * fsdp.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:?usage: launch/gpu_node.sh CONFIG [--config.x=y ...]}"
shift
PYTHON="${PYTHON:-python}"
if [[ "${INSTALL:-0}" == 1 ]]; then
  # JAX_CUDA picks the CUDA wheel set of jax 0.10.2 that matches the driver (cuda12 or cuda13).
  "${PYTHON}" -m pip install -e . "jax[${JAX_CUDA:-cuda12}]==0.10.2"
fi
# Overlap collectives with compute; let jax take most of each GPU's memory up front.
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true ${XLA_FLAGS:-}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
"${PYTHON}" -c 'import jax; print("tokjax: GPUs seen by jax:", jax.devices())'
exec "${PYTHON}" -m tokjax.train --config "${CONFIG}" --config.mesh.multihost=off "$@"
