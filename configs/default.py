r"""The main job: the score-function method (learned boundaries) at CPU size on the standard library.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate 0.2;
sequences of 256 bytes, batch 16, 600 steps on the embedded Python standard-library corpus.
Expect (measured on 2 CPU cores, see README): RESULT_DEFAULT
"""

from tokjax.config_defaults import base_config


def get_config():
  return base_config()
