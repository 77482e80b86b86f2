r"""The main job: the score-function method (learned boundaries) at CPU size on embedded English.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate
0.2; sequences of 256 bytes, batch 16, 600 steps on `stdlib_docs` (English from the Python standard
library: its long docstrings and the help() topics, 1.8 MB, no download). 0.86M parameters;
2 minutes wall, 3.5 CPU-minutes on 2 idle cores (`/usr/bin/time -v`; the README's Quickstart
shows the output: final val bpb 2.3762, greedy boundaries on 0.62 of the spaces).
Expect (results/main_job/README.md, seeds 0 and 1, one XLA thread): test bpb 2.620 and 2.566, greedy
boundaries on 0.66 and 0.60 of the spaces at step 600, still moving onto them; when the policy
jumps to "word + space" chunks depends on the seed and on floating-point details.
"""

from tokjax.config.defaults import base_config


def get_config():
  return base_config()
