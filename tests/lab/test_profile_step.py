"""The step profiler: a real traced train step, its op time attributed to the model's components."""

from conftest import tiny_config

from tokjax.lab.benchmarks import profile_step


def test_a_traced_step_is_attributed_to_the_models_components(tmp_path):
  found = profile_step.profile(tiny_config(str(tmp_path)), 2, 64, 0.5, steps=1)
  assert (found['batch'], found['seq_len'], found['capacity']) == (2, 64, 32)
  shares = {r['component']: r['share'] for r in found['components']}
  # The ops land in the components by their module paths, not all in the rest.
  for name in ('encoder (byte layers)', 'main network (chunk layers)', 'decoder (byte layers)'):
    assert shares.get(name, 0) > 0.02, shares
  assert shares.get(profile_step.REST, 0) < 0.5, shares
  assert abs(sum(shares.values()) - 1) < 0.01
  ms = sum(r['ms'] for r in found['components'])
  assert abs(ms - found['op_ms']) < 0.1 * len(shares) and 0 < found['op_ms'] <= 2 * found['step_ms']
  assert {r['kind'] for r in found['kinds']} <= {'dot or YNNPACK fusion', 'other'}


def test_an_op_goes_to_the_first_component_its_path_names():
  path = (
      'jit(_train_step)/transpose(jvp(HierarchicalByteLM))/HierarchicalByteLM/main/block_0/attn/dot'
  )
  assert profile_step.component(path) == 'main network (chunk layers)'
  assert profile_step.component('jit(_train_step)/jvp()/exp') == profile_step.REST
  hlo = '  %dot.3 = f32[2,2]{1,0} dot(...), metadata={op_type="dot" op_name="a/encoder/b"}\n'
  assert profile_step.op_names(hlo) == {'dot.3': 'a/encoder/b'}
