r"""The flat byte Transformer (no chunking): the uncompressed reference, at CPU size.

  python -m tokjax.train --config configs/flat_cpu.py

d_model 128, 4 Gemma-2 blocks (full causal attention), sequences of 256 bytes, batch 16, 600 steps on
the standard-library corpus. Expect (measured on 2 CPU cores, see README): RESULT_FLAT
"""

from tokjax.config_defaults import base_config


def get_config():
  c = base_config()
  c.model.kind = 'flat'
  c.model.byte_window = 0
  c.estimator.kind = 'none'
  c.train.workdir = 'runs/flat_cpu'
  return c
