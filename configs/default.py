r"""The main job: the score-function method (learned boundaries) at CPU size on the standard library.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate 0.2;
sequences of 256 bytes, batch 16, 600 steps on the embedded Python standard-library corpus.
Expect (measured on 2 CPU cores shared with other jobs: 15m14s): 0.86M parameters, final val bpb 2.308 (greedy boundaries 2.323) against gzip -9
1.995 and xz -9 1.681, rate 0.217, boundaries after newlines and inside identifiers (whitespace
fraction 0.08). On English (--config.data.corpus=shakespeare) the same config learns "word + space"
chunks: whitespace fraction 0.99 and val bpb 2.356 after 1200 steps (results/learning/).
"""

from tokjax.config_defaults import base_config


def get_config():
  return base_config()
