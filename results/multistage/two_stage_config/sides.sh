#!/bin/bash
# Which side of the space stage 0 settles on, per seed: trains CONFIG at each seed on core CORE (one
# XLA thread) and stops the run once step $STOP (default 250) is logged. Logs go to OUT/TAG_sSEED.log.
#   ./sides.sh CORE OUT TAG CONFIG SEED...    (extra flags of python -m tokjax.train in $EXTRA)
# Run from the repository root.
core=$1; out=$2; tag=$3; config=$4; shift 4
stop=$(printf "%6d" "${STOP:-250}")
mkdir -p "$out"
for s in "$@"; do
  log=$out/${tag}_s$s.log
  taskset -c "$core" env XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
    python -m tokjax.train --config "$config" --config.seed="$s" \
    --config.train.workdir="$out/${tag}_s$s" --config.train.eval_every=100000 \
    --config.train.checkpoint_every=100000 $EXTRA > "$log" 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    if grep -q "step $stop/" "$log"; then kill $pid; break; fi
    sleep 5
  done
  wait $pid 2>/dev/null
done
