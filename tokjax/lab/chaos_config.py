"""The chaos tool's default run: a tiny hierarchical model that checkpoints every 5 of its 30 steps.

  python -m tokjax.lab.chaos --config tokjax/lab/chaos_config.py

Small, so that a run with many kills stays short, and saving often enough that random kills land
during and just after saves as well as between them (it logs every step for the same reason).
"""

from tokjax.config.defaults import base_config


def get_config():
  c = base_config()
  c.model.d_model, c.model.capacity = 32, 32
  c.data.seq_len, c.data.batch_size, c.data.max_bytes = 64, 4, 200_000
  c.data.val_fraction = c.data.test_fraction = 0.1  # Several documents per split.
  c.eval.batch_size, c.eval.max_batches = 4, 2
  c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 30, 1, 10, 5
  c.train.workdir = 'runs/chaos'  # The tool puts each run in its own folder under --workdir.
  return c
