#!/usr/bin/env bash
# Downloads (here, online) the wheels that an offline GPU image lacks, for launch/device_check.sh.
#
#   launch/fetch_wheels.sh [DEST]        # default DEST: .wheels (git-ignored)
#
# The GPU images this project reaches hold python 3.12, jax 0.11.2 + its CUDA 13 plugin, flax, optax,
# orbax-checkpoint, chex, tokenizers and matplotlib, but not grain, ml_collections, array-record or
# tensorboardX (nor grain's cloudpickle and portpicker, and its psutil). This fetches exactly those, as binary wheels
# for CPython 3.12 on manylinux x86_64, without their dependencies (which the image has). Copy DEST
# with the repository; device_check.sh installs them with `pip install --no-index --no-deps`.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.wheels}"
PYVER="${PYVER:-3.12}"
mkdir -p "${DEST}"
PACKAGES=(
  grain==0.2.18
  array-record==0.8.6
  ml_collections==1.1.0
  tensorboardX==2.6.5
  cloudpickle==2.1.0
  portpicker==1.6.0
  psutil==7.2.2
)
for pkg in "${PACKAGES[@]}"; do
  python -m pip download --no-deps --only-binary=:all: --python-version "${PYVER}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "${DEST}" "${pkg}"
done
ls -l "${DEST}"
