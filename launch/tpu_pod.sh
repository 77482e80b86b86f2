#!/usr/bin/env bash
# Install tokjax on every worker of a Cloud TPU VM pod slice and start the same training command on
# all of them (one process per worker VM, each driving its local TPU chips).
#
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a launch/tpu_pod.sh configs/default.py --config.mesh.fsdp=-1 \
#       --config.mesh.data=1 --config.train.workdir=/mnt/shared/runs/v5e32
#
# Steps: copy this checkout to every worker (scp --worker=all), pip-install it with the TPU jaxlib,
# then run `python -m tokjax.train` on all workers at once (ssh --worker=all). With
# --config.mesh.multihost=on each process calls jax.distributed.initialize(), which finds the other
# workers from the TPU metadata. config.train.workdir must be a folder that every worker sees at the
# same path (a GCS bucket mounted with gcsfuse, or Filestore/NFS): orbax writes each checkpoint from
# all processes together. The workers' output streams here; SKIP_INSTALL=1 reuses an earlier install.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to its zone, e.g. us-central2-b}"
CONFIG="${1:?usage: launch/tpu_pod.sh CONFIG [--config.x=y ...]}"
shift
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project "${PROJECT}"); fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REMOTE_DIR="${REMOTE_DIR:-tokjax}"
tpu() { gcloud compute tpus tpu-vm "$@" "${TPU_NAME}" --zone "${ZONE}" "${PROJECT_FLAG[@]}"; }

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  tar -C "${ROOT}" --exclude=.git --exclude=runs --exclude='*.egg-info' -czf /tmp/tokjax_src.tgz .
  gcloud compute tpus tpu-vm scp /tmp/tokjax_src.tgz "${TPU_NAME}:~/tokjax_src.tgz" --worker=all \
    --zone "${ZONE}" "${PROJECT_FLAG[@]}"
  tpu ssh --worker=all --command "set -e; mkdir -p ~/${REMOTE_DIR}; tar -xzf ~/tokjax_src.tgz \
    -C ~/${REMOTE_DIR}; cd ~/${REMOTE_DIR}; python3 -m pip install -q -e . 'jax[tpu]==0.10.2'"
fi

# Quote every argument so that the remote shell sees them unchanged.
ARGS="$(printf ' %q' --config "${CONFIG}" --config.mesh.multihost=on "$@")"
tpu ssh --worker=all --command "cd ~/${REMOTE_DIR} && python3 -m tokjax.train${ARGS}"
