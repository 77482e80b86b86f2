r"""The main job: the score-function method (learned boundaries) at CPU size on Shakespeare.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate
0.2; sequences of 256 bytes, batch 16, lr 2e-3, 600 steps on `shakespeare` (the plays and poems,
5.06 MB, shipped with tokjax: no download). 0.86M parameters; about 2 minutes on 2 idle cores. The
library defaults (configs/compare.py:policy) on Shakespeare: on their `stdlib_docs` the policy ends
chunks on the spaces at some seeds only, whatever the lr, batch or estimator (results/main_job).
Expect (results/main_job/README.md, seeds 0-9, one XLA thread and the default threads): greedy
boundaries on every space of val by step 600 at 10 of 10 seeds; test bpb 2.562 +- 0.003.
"""

from tokjax.config.defaults import base_config


def get_config():
  c = base_config()
  c.data.corpus = 'shakespeare'
  return c
