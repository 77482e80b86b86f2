"""StepProfiler: a real jax.profiler trace of exactly the configured steps."""

import glob
import os

import jax
import jax.numpy as jnp

from tokjax import profiling
from tokjax.config import defaults as config_defaults


def test_trace_written_for_the_window(tmp_path):
  c = config_defaults.base_config()
  c.train.workdir = str(tmp_path)
  assert not profiling.StepProfiler.from_config(c).active  # Off by default.
  c.train.profile_steps = (2, 3)
  prof = profiling.StepProfiler.from_config(c)
  f = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((64, 64))
  started = []
  for step in range(6):
    prof.before_step(step)
    started.append(prof.active)
    x = f(x)
    prof.after_step(step, x)
  assert started == [False, False, True, True, False, False] and prof.done
  traces = glob.glob(os.path.join(str(tmp_path), 'profile', '**', '*.xplane.pb'), recursive=True)
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
