r"""The main job: the score-function method (learned boundaries) at CPU size on embedded English.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate
0.2; sequences of 256 bytes, batch 16, 600 steps on `stdlib_docs` (English from the Python standard
library: its long docstrings and the help() topics, 1.8 MB, no download). 0.86M parameters.
Expect: the README's Quickstart output (cost and final val bpb, greedy boundaries on the spaces);
results/main_job/README.md has the same run at ten seeds.
"""

from tokjax.config_defaults import base_config


def get_config():
  return base_config()
