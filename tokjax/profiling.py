"""A `jax.profiler` trace of training steps N..M, switched by config.train.profile_steps = (N, M).

  profiler = profiling.StepProfiler.from_config(config)    # off when profile_steps is (0, 0)
  for step in range(start, steps):
    profiler.before_step(step)
    state, metrics = trainer.train_step(state, batch, key)
    profiler.after_step(step, metrics)                     # blocks on metrics at step M, then stops

The trace (TensorBoard / Perfetto `*.xplane.pb` under <logdir>/plugins/profile/<run>/) covers steps N
to M inclusive. N should be past the first step, whose compile would otherwise fill the trace. View
it with `tensorboard --logdir <logdir>` (profile plugin) or upload the .xplane.pb / trace.json.gz to
https://ui.perfetto.dev.
"""

import os

import jax

from tokjax.errors import UserError


def validate(config) -> None:
  """UserError unless config.train.profile_steps is (0, 0) (off) or a window (N, M) of steps,
  0 <= N <= M (both traced)."""
  window = config.train.profile_steps
  ok = isinstance(window, (tuple, list)) and len(window) == 2
  ok = ok and all(isinstance(s, int) and not isinstance(s, bool) for s in window)
  if not ok or not 0 <= window[0] <= window[1]:
    raise UserError(
        f'config.train.profile_steps={tuple(window) if ok else window!r} must be two step numbers '
        '(N, M) with 0 <= N <= M (steps N to M are traced), or (0, 0) for no trace; e.g. '
        "--config.train.profile_steps='(5, 8)'."
    )


class StepProfiler:
  """Starts a trace before step `first` and stops it after step `last` (inclusive)."""

  def __init__(self, first: int, last: int, logdir: str):
    if last < first:
      raise ValueError(f'profile steps ({first}, {last}): the last step comes before the first.')
    self.first, self.last, self.logdir = first, last, logdir
    self.active = False
    self.done = False

  @classmethod
  def from_config(cls, config, logdir=None):
    """None-safe: returns a profiler that does nothing when config.train.profile_steps is (0, 0)."""
    first, last = tuple(config.train.profile_steps)
    if (first, last) == (0, 0):
      return _Off()
    return cls(first, last, logdir or os.path.join(config.train.workdir, 'profile'))

  def before_step(self, step: int) -> None:
    if not self.done and not self.active and self.first <= step <= self.last:
      os.makedirs(self.logdir, exist_ok=True)
      jax.profiler.start_trace(self.logdir)
      self.active = True

  def after_step(self, step: int, outputs=None) -> None:
    """Stops after step `last`, once `outputs` (the step's metrics) are computed."""
    if self.active and step >= self.last:
      if outputs is not None:
        jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active, self.done = False, True

  def close(self) -> None:
    """Stops a trace still running (training ended inside the window)."""
    if self.active:
      jax.profiler.stop_trace()
      self.active, self.done = False, True


class _Off:
  """The profiler when profiling is off."""

  active = done = False

  def before_step(self, step):
    del step

  def after_step(self, step, outputs=None):
    del step, outputs

  def close(self):
    pass
