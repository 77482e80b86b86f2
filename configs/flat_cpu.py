r"""The flat byte Transformer (no chunking): the uncompressed reference, at CPU size.

  python -m tokjax.train --config configs/flat_cpu.py

d_model 128, 4 Gemma-2 blocks (full causal attention), sequences of 256 bytes, batch 16, 600 steps on
the standard-library corpus; 1.12M parameters, 15m05s with one XLA thread on a loaded 2-core machine.
Expect: final val bpb 1.856 against gzip -9 1.995 and xz -9 1.681. Per step the flat model is ahead
of the hierarchical default (2.308 at 0.86M parameters): at CPU scale chunking buys speed at long
sequences, not bits (results/benchmarks/README.md, `python -m tokjax.lab.benchmarks.throughput`).
"""

from tokjax.config.defaults import base_config


def get_config():
  c = base_config()
  c.model.kind = 'flat'
  c.model.byte_window = 0
  c.train.workdir = 'runs/flat_cpu'
  return c
