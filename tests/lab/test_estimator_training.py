"""The equal-compute estimator comparison: its variants really are at equal compute, and its summary
reads the learning curves right (first crossing, late averages, seeds that never got there)."""

import json
import os

import pytest

from tokjax.errors import UserError
from tokjax.lab import estimator_training as et


@pytest.mark.parametrize('tiny', [False, True])
def test_variants_spend_equal_draws_per_step_except_the_reference(tiny):
  configs = {v: et.variant_config(v, 'shakespeare', 0, 10, 5, tiny) for v in et.variants()}
  full = et.draws_per_step(configs['full'])
  assert full == (4 if tiny else 16)
  for name, c in configs.items():
    assert c.estimator.baseline == {'full': 'batch', 'gae': 'value'}.get(name, 'rloo'), name
    assert c.train.steps == 10 and c.data.corpus == 'shakespeare'
    assert et.draws_per_step(c) == (4 * full if name == 'rloo4x16' else full), name
  # RLOO at equal draws sees K times fewer sequences: the trade the comparison measures.
  assert configs['rloo4x4'].data.batch_size * 4 == configs['full'].data.batch_size
  with pytest.raises(UserError, match='unknown variant'):
    et.variant_config('ppo', 'shakespeare', 0, 10, 5)


def _write_run(workdir, ws, bpb):
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for i, (w, b) in enumerate(zip(ws, bpb)):
      step = 50 * (i + 1)
      f.write(json.dumps({'step': step, 'split': 'train', 'whitespace_recall': 0.0}) + '\n')
      f.write(
          json.dumps(
              {
                  'step': step,
                  'split': 'val',
                  'whitespace_recall': w,
                  'bpb': b,
                  'whitespace_precision': w / 2,
                  'greedy_whitespace_recall': 1.0,
                  'rate': 0.2,
              }
          )
          + '\n'
      )


def test_summary_reads_first_crossing_and_late_averages(tmp_path):
  config = et.variant_config('rloo4x4', 'shakespeare', 0, 300, 50)
  ws = [0.3, 0.6, 0.92, 0.85, 0.95, 0.97]  # Crosses 0.9 at step 150, dips, recovers.
  _write_run(tmp_path / 'a', ws, [3.0, 2.9, 2.8, 2.7, 2.6, 2.5])
  result = {'train_bytes_per_s': 2048.0, 'wall_s': 100.0}
  s = et.summarize_run(str(tmp_path / 'a'), config, result)
  assert s['steps_to_ws'] == 150
  assert s['late_ws'] == pytest.approx((0.95 + 0.97) / 2)  # The last third: steps 250 and 300.
  assert s['late_ws_precision'] == pytest.approx((0.95 + 0.97) / 4)
  assert s['final_bpb'] == 2.5
  assert s['step_s'] == pytest.approx(4 * 256 / 2048.0)  # B = 4 sequences of 256 bytes per step.
  assert s['draws_per_step'] == 16 and s['train_bytes'] == 300 * 4 * 256


def test_table_averages_seeds_and_counts_runs_that_never_learned(tmp_path):
  config = et.variant_config('full', 'shakespeare', 0, 300, 50)
  result = {'train_bytes_per_s': 4096.0, 'wall_s': 1.0}
  _write_run(tmp_path / 'a', [0.4, 0.91, 0.95, 0.96, 0.97, 0.98], [3.0] * 6)
  _write_run(tmp_path / 'b', [0.6, 0.69, 0.75, 0.7, 0.8, 0.8], [3.2] * 6)
  runs = {'full': [et.summarize_run(str(tmp_path / n), config, result) for n in 'ab']}
  et.write_outputs(
      str(tmp_path),
      runs,
      {'corpus': 'x', 'steps': 300, 'eval_every': 50, 'seeds': {'full': [0, 1]}, 'command': 'cmd'},
  )
  row = next(
      l for l in (tmp_path / 'results.md').read_text().splitlines() if l.startswith('| full')
  )
  cells = [c.strip() for c in row.split('|')[1:-1]]
  assert cells[3:6] == ['0.50 ± 0.14', '0.80 ± 0.16', '0.85 ± 0.14']  # ws @50, @100, @150.
  assert cells[6] == '100 (1/2)'  # Only seed a got to 0.9, at step 100.
  assert cells[-3] == '3.100 ± 0.141'  # final val bpb over the two seeds.
  assert (tmp_path / 'curves.png').stat().st_size > 0


def test_variant_specs_take_their_own_seeds():
  assert et.parse_variants(['full', 'rloo4x16:0+2'], [0, 1, 2]) == {
      'full': [0, 1, 2],
      'rloo4x16': [0, 2],
  }
  with pytest.raises(UserError, match='seeds after'):
    et.parse_variants(['full:x'], [0])
