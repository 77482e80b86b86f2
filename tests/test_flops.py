"""The analytic FLOP count against XLA's cost_analysis of the compiled train step, and the MFU helpers."""

import jax
import pytest

from tokjax import compile_check, flops, stages
from tokjax.config import defaults as config_defaults


def _config(kind):
  c = config_defaults.base_config()  # d_model 128, L = 256: matrix multiplies dominate the step.
  c.data.batch_size = 4
  c.mesh.data = 1
  if kind == 'flat':
    c.model.kind, c.model.byte_window = 'flat', 0
  else:
    c.boundary.policy.window = 8  # The paper's sequential policy.
  if kind == 'occupied_prefix':  # A buffer the main network runs on a prefix of (a switch).
    c.model.capacity = 256
  if kind == 'two_stage':
    c.model.stages = 2
    c.stages.s1.boundary.update(method='policy', target_rate=0.33)
    c.stages.s1.model.update(capacity=48, encoder_layers=1, decoder_layers=2, byte_window=0)
  return c


@pytest.mark.parametrize('kind', ['flat', 'hierarchical', 'two_stage', 'occupied_prefix'])
def test_executed_flops_match_xla(kind):
  config = _config(kind)
  report = compile_check.check(config, jax.devices()[:1], compile_eval=False)
  levels = stages.resolve(config)
  analytic = flops.step_flops(config, levels=levels)
  xla = report['xla_flops_per_device']
  assert analytic == report['analytic_flops_per_step']
  assert abs(analytic - xla) / xla < 0.10, (analytic, xla)
  # Only the buffer of 256 slots runs on a prefix, whose backward recomputes its forward.
  assert (flops.recomputed_flops_per_sequence(config, levels=levels) > 0) == (
      kind == 'occupied_prefix'
  )


def test_model_flops_follow_the_realised_rate():
  config = _config('hierarchical')
  levels = stages.resolve(config)
  low = flops.step_flops(config, rate=0.1, levels=levels)
  high = flops.step_flops(config, rate=0.3, levels=levels)
  # Only the main network depends on the rate: 3 passes x B x main_layers blocks on the extra chunks.
  m, d, seq, b = config.model, config.model.d_model, config.data.seq_len, config.data.batch_size
  linear = 3 * b * m.main_layers * (8 * d * d + 6 * d * m.main_mlp_ratio * d) * 0.2 * seq
  assert high - low > linear  # Plus attention, quadratic in the chunk count.
  assert high - low < 1.2 * linear
  per_byte = flops.flops_per_byte(config, 0.2, levels=levels)
  assert per_byte * seq * b == pytest.approx(flops.step_flops(config, 0.2, levels=levels))


def test_two_stage_model_flops_follow_each_stage_rate():
  config = _config('two_stage')
  levels = stages.resolve(config)
  base = flops.step_flops(config, rate=(0.2, 0.33), levels=levels)
  # A stage without a rate of its own is costed at its target.
  assert flops.step_flops(config, rate=0.2, levels=levels) == pytest.approx(base)
  # More stage-1 chunks: only the main network grows. More stage-0 chunks: stage 1's layers and
  # the main network both grow.
  more_inner = flops.step_flops(config, rate=(0.2, 0.5), levels=levels) - base
  more_outer = flops.step_flops(config, rate=(0.3, 0.33), levels=levels) - base
  m, d, seq, b = config.model, config.model.d_model, config.data.seq_len, config.data.batch_size
  block = 3 * b * (8 * d * d + 6 * d * m.main_mlp_ratio * d)
  assert more_inner == pytest.approx(block * m.main_layers * 0.2 * seq * (0.5 - 0.33), rel=0.2)
  stage1_layers = config.stages.s1.model.encoder_layers + config.stages.s1.model.decoder_layers
  assert more_outer > block * stage1_layers * 0.1 * seq


def test_peak_and_mfu():
  cpu = jax.devices('cpu')[0]
  measured = flops.measure_matmul_peak(n=256, repeats=2)
  assert 1e8 < measured < 1e13  # A CPU core does between 0.1 GFLOP/s and 10 TFLOP/s.
  assert flops.peak_flops(cpu) is None and flops.peak_flops(cpu, measured) == measured
  assert flops.mfu(2e12, 2.0, 1e12) == pytest.approx(1.0)
  assert flops.mfu(1e12, 1.0, 1e12, num_devices=4) == pytest.approx(0.25)
