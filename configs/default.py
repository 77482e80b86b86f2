r"""The main job: the score-function method (learned boundaries) at CPU size on embedded English.

  python -m tokjax.train --config configs/default.py

Hierarchical byte LM, d_model 128, encoder/main/decoder 1/2/1 blocks, independent (w = 1) boundary
policy trained with time-discounted, early-exit-relative, batch-relative REINFORCE at target rate 0.2;
sequences of 256 bytes, batch 16, 600 steps on `stdlib_docs` (English from the Python standard
library: its long docstrings and the help() topics, 1.8 MB, no download).
Expect (measured on 2 CPU cores while other jobs ran, wall 31m51s; 6.6 CPU-minutes): 0.86M
parameters, final val bpb 2.377 (greedy boundaries 2.379) against gzip -9 2.632 and xz -9 2.462 of
the same split, rate 0.217, greedy boundaries on 58% of the spaces at step 600, rising. When the policy jumps to
"word + space" chunks depends on floating-point details: with one XLA thread the same code jumps
at step 300 (99% of the spaces from step 400), as did an earlier commit's multi-threaded run
(results/default_corpus/, final 2.370). On the library's source code
(--config.data.corpus=stdlib) the same run ended, at that commit, at val bpb 2.307 against gzip -9 1.995 and xz -9
1.681, with chunks inside identifiers (whitespace fraction 0.08).
"""

from tokjax.config_defaults import base_config


def get_config():
  return base_config()
