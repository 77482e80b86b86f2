"""Generation against the model's own training forward pass, and sliding generation past the window.

The models are the tests' tiny configs at a fresh initialisation, their boundary logits spread: the
6-step fixture run `tiny_run` is too short to decide boundaries greedily (after TEXT[:10] its greedy
policy closed no chunk past the forced first one and its greedy bytes repeated one byte), which
would leave the comparisons vacuous.
"""

from conftest import jit_call, tiny_config, tiny_two_stage_config
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tokjax import decoding, models, stages
from tokjax.data import BOS_ID, PAD_ID
from tokjax.errors import UserError
from tokjax.models import hierarchical

# Code, so that a greedy continuation depends on more than the last few bytes.
TEXT = (
    b'import os\nimport sys\n\n\ndef main(argv):\n  """Prints every file under the folders named.'
    b'"""\n  for path in argv[1:]:\n    for root, _, files in os.walk(path):\n'
)


def fresh_model(config, spread: float = 1.0, seed: int = 1, scale: float = 1.0):
  """config's model and fresh parameters (init key `seed`), all of them times `scale`, and every
  boundary policy's projection times `spread` more (at initialisation the policy's logits hardly move
  from its bias, so every greedy decision would be the same)."""
  model = models.build_model(config, levels=stages.resolve(config))
  args = models.init_args(config, 1, 32)
  params = nn.unbox(jit_call(model.init, jax.random.PRNGKey(seed), *args)['params'])
  params = jax.tree_util.tree_map(lambda x: x * scale, params)
  for name in params:
    if hierarchical.is_boundary_module(name):
      params[name]['proj']['kernel'] = params[name]['proj']['kernel'] * spread
  return model, params


@pytest.fixture(scope='module')
def one_stage():
  c = tiny_config('')
  # Byte layers over 8 positions: generation runs past their ring buffers. Capacity: no chunk dropped.
  c.model.update(byte_window=8, main_layers=2, capacity=128)
  c.boundary.policy.window, c.boundary.policy.scale = 3, 4.0  # Reads its own history.
  return fresh_model(c, spread=10.0)


@pytest.fixture(scope='module')
def two_stage():
  c = tiny_two_stage_config('')
  c.model.capacity, c.stages.s1.model.capacity = 128, 64
  # At seed 1, or unscaled, its greedy bytes after TEXT[:10] soon repeat one byte.
  return fresh_model(c, spread=15.0, seed=2, scale=2.0)


def training_forward(model, params, tokens, levels):
  """The training forward (`model.apply` in mode 'given', as `losses.hierarchical_objective` calls it
  with `actions`) on tokens int32[B, N] whose chunk ends at every stage are levels float32[B, S, N].

  One spare PAD position at the end takes the convention's forced last boundary, as the buffers of
  generation do, so the decision at N - 1 is the generated one. Stage s >= 1 decides on the chunks of
  stage s - 1: its action at a chunk is whether a stage-s chunk ends on that chunk's last byte.
  Returns the `interface.ModelOutput` over N + 1 positions.
  """
  tokens = np.pad(tokens, ((0, 0), (0, 1)), constant_values=PAD_ID)
  levels = np.pad(levels, ((0, 0), (0, 0), (0, 1)))
  levels[:, 0, -1] = 1.0  # The convention forces it; marked here, it ends stage 1's last input.
  capacities = model.capacities()
  # Every stage's chunks fit its buffer: the forward drops none, as generation (whose buffers hold
  # every possible chunk) does not.
  assert all(levels[:, s].sum(-1).max() < capacities[s] for s in range(model.num_stages))
  given = [levels[:, 0]]
  for s in range(1, model.num_stages):
    acts = np.zeros((tokens.shape[0], capacities[s - 1]), np.float32)
    for b in range(tokens.shape[0]):
      ends = np.flatnonzero(levels[b, s - 1])
      acts[b, : len(ends)] = levels[b, s, ends]
    given.append(acts)
  actions = given[0] if model.num_stages == 1 else tuple(given)
  key = jax.random.PRNGKey(0)  # Read by no stage: every decision is given.
  return jax.device_get(
      jit_call(model.apply, {'params': params}, tokens, key, mode='given', actions=actions)
  )


def test_training_forward_reads_the_given_boundaries(one_stage):
  # The reference below is not vacuous: other boundaries on the same bytes give other logits.
  model, params = one_stage
  tokens = np.asarray(decoding.encode_prompt(TEXT[:50], batch=2))
  every_fourth = np.broadcast_to(np.arange(tokens.shape[1]) % 4 == 0, (2, 1, tokens.shape[1]))
  every_fourth = every_fourth.astype(np.float32)
  a = training_forward(model, params, tokens, every_fourth)
  b = training_forward(model, params, tokens, np.roll(every_fourth, 1, axis=-1))
  assert np.abs(a.logits[:, :-1] - b.logits[:, :-1]).max() > 1e-2


def _prompts():
  """Two rows, prompts of 10 and 5 bytes sharing one buffer (`generate`'s lengths, as `slide` runs
  them) -> (int32[2, 11] buffer, int32[2] lengths)."""
  buf = np.array(decoding.encode_prompt(TEXT[:10], batch=2))
  buf[1, 1:6], buf[1, 6:] = np.frombuffer(TEXT[40:45], np.uint8), PAD_ID
  return buf, np.array([11, 6], np.int32)


def _check(gen, levels, out, p):
  """Generation's logits are the forward's; it made varied bytes and every stage varied chunks, so
  the agreement is not vacuous."""
  np.testing.assert_allclose(gen['logits'].swapaxes(0, 1), out.logits[:, :-1], atol=1e-4)
  assert len(np.unique(gen['tokens'][:, p:])) > 3, 'varied bytes, not one repeated'
  for s in range(levels.shape[1]):
    assert 0 < levels[:, s, 1:].sum() < levels[:, s, 1:].size, f'stage {s} has varied chunks'


@pytest.mark.parametrize(
    'mode,temperature,top_k,cached',
    [('greedy', 0.0, 0, True), ('sample', 1.0, 0, True), ('sample', 0.8, 40, False)],
)
def test_one_stage_generation_gives_the_training_forward_logits(
    one_stage, mode, temperature, top_k, cached
):
  model, params = one_stage
  prompt, lengths = _prompts()
  key, p = jax.random.PRNGKey(3), prompt.shape[1]
  settings = {'mode': mode, 'temperature': temperature, 'top_k': top_k, 'cached': cached}
  gen = jax.device_get(
      decoding.generate(model, params, prompt, key, 40, **settings, lengths=lengths)
  )
  levels = gen['actions'][:, None]
  out = training_forward(model, params, gen['tokens'], levels)
  _check(gen, levels, out, p)
  np.testing.assert_allclose(gen['policy_logits'].T, out.boundaries.logits[:, :-1], atol=1e-4)
  if mode == 'greedy':
    # The bytes and boundaries are the forward's most likely ones.
    np.testing.assert_array_equal(gen['tokens'][:, p:], out.logits[:, p - 1 : -2, :256].argmax(-1))
    np.testing.assert_array_equal(gen['actions'][:, 1:], out.boundaries.logits[:, 1:-1] > 0)


@pytest.mark.parametrize(
    'mode,temperature,top_k,cached', [('greedy', 0.0, 0, True), ('sample', 1.0, 0, False)]
)
def test_two_stage_generation_gives_the_training_forward_logits(
    two_stage, mode, temperature, top_k, cached
):
  model, params = two_stage
  assert model.num_stages == 2
  prompt, lengths = _prompts()
  key, p = jax.random.PRNGKey(3), prompt.shape[1]
  settings = {'mode': mode, 'temperature': temperature, 'top_k': top_k, 'cached': cached}
  gen = jax.device_get(
      decoding.generate_stages(model, params, prompt, key, 40, **settings, lengths=lengths)
  )
  out = training_forward(model, params, gen['tokens'], gen['actions'])
  _check(gen, gen['actions'], out, p)
  if mode == 'greedy':
    np.testing.assert_array_equal(gen['actions'][:, 0, 1:], out.boundaries.logits[:, 1:-1] > 0)
    np.testing.assert_array_equal(gen['tokens'][:, p:], out.logits[:, p - 1 : -2, :256].argmax(-1))


# Every step of greedy `decoding.slide` with window 64 and 80 new bytes, on a prompt of each length,
# worked out by hand from its docstring: (start, end, BOS first, new bytes) of the step's buffer, as
# offsets into the text so far (prompt + the bytes made). The first step's cut is
# 63 - min(80, 63 - 32) = 32 and every later one 32: a text of at most 32 bytes is read whole after
# BOS, a longer one's last 33 bytes with no BOS; a step fills the window (or ends at 80 bytes).
SLID = {
    20: [(0, 20, True, 43), (30, 63, False, 31), (61, 94, False, 6)],
    28: [(0, 28, True, 35), (30, 63, False, 31), (61, 94, False, 14)],
    32: [(0, 32, True, 31), (30, 63, False, 31), (61, 94, False, 18)],
    33: [(0, 33, False, 31), (31, 64, False, 31), (62, 95, False, 18)],
    63: [(30, 63, False, 31), (61, 94, False, 31), (92, 125, False, 18)],
    64: [(31, 64, False, 31), (62, 95, False, 31), (93, 126, False, 18)],
    100: [(67, 100, False, 31), (98, 131, False, 31), (129, 162, False, 18)],
}


def greedy_after(model, params, buf: list[int], window: int) -> bytes:
  """The bytes plain greedy `generate` makes after the tokens buf, filling the window."""
  out = decoding.generate(
      model,
      params,
      jnp.asarray([buf], jnp.int32),
      jax.random.PRNGKey(0),
      window - len(buf),
      mode='greedy',
      temperature=0.0,
  )
  return bytes(np.asarray(out['tokens'])[0, len(buf) :].tolist())


def test_sliding_generation_keeps_the_prompt_its_docstring_says(one_stage):
  model, params = one_stage
  # Between half of the first step's 32 and 32 bytes (the old code kept 12 and 4 of them), at the
  # edge, longer, one short of the window, the window and longer.
  prompts = [TEXT[:n] for n in SLID]
  steps = list(
      decoding.slide(
          model,
          params,
          prompts,
          jax.random.PRNGKey(7),
          window=64,
          max_bytes=80,
          mode='greedy',
          temperature=0.0,
      )
  )
  wrong = []
  for i, (n, table) in enumerate(SLID.items()):
    slid = [news[i][0] for news in steps if news[i][0]]
    text = prompts[i] + b''.join(slid)
    assert [len(s) for s in slid] == [count for *_, count in table], f'{n} bytes'
    for k, (start, end, bos, count) in enumerate(table):
      assert end == n + sum(c for *_, c in table[:k])  # The table reads the text made so far.
      buf = [BOS_ID] * bos + list(text[start:end])
      if slid[k] != greedy_after(model, params, buf, 64)[:count]:
        wrong.append((n, k))
  assert not wrong, f'(prompt length, step) that slid otherwise: {wrong}'


def test_sliding_generation_refuses_a_window_with_no_room(one_stage):
  model, params = one_stage
  steps = decoding.slide(
      model, params, [b'ab'], jax.random.PRNGKey(0), window=2, max_bytes=4, mode='greedy'
  )
  with pytest.raises(UserError, match='window of 2 positions'):
    next(steps)
