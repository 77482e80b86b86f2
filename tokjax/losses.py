"""Training objectives: next-byte cross-entropy for the flat model, and for the hierarchical model the
paper's total loss (1 - lambda_early) CE_full + lambda_early CE_early + policy loss + rate loss (+ any
auxiliary loss of the boundary method), with the boundary metrics that expose a broken estimator.

Counterfactual rewards (config.estimator.reward or a stage's estimator.reward = 'counterfactual' or
'counterfactual_greedy'; tokjax/estimator.py): the reward of stage s is CE_cf - CE_full, where CE_cf
is the full model's CE from one more forward pass under stop-gradient, with the sampled decisions of
stages 0..s-1 executed as given and stage s and every stage above drawn again ('counterfactual': from
the policies, with a key independent of the training draw's; 'counterfactual_greedy': their greedy
patterns). Cost: one forward pass (no backward) per stage that uses it, so a training step costs
3 + n forward passes instead of 3 for n such stages; tokjax/flops.py counts them
(`counterfactual_stages`).
"""

import functools
import math

import jax
import jax.numpy as jnp
import optax

from tokjax import boundary_stats, estimator, models, stages
from tokjax.models import interface

LN2 = math.log(2.0)


def cross_entropy(logits, targets):
  """logits: float32[B, L, V], targets: int32[B, L] -> nats: float32[B, L]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def boundary_metrics(tokens, actions, mask, dropped=None):
  """Rate, bytes per chunk, whitespace and line alignment (and overflow) of boundaries.

  tokens: int32[B, L] the bytes the boundaries follow; actions: {0,1}[B, L]; mask: {0,1}[B, L] the
  scored positions; dropped: optional float32[B, L] boundaries dropped for capacity.
  """
  refs = boundary_stats.masks(boundary_stats.BUILTIN, tokens)
  ws = boundary_stats.count(actions, mask, refs['whitespace'])
  # Line alignment: text has one newline per ~40-80 bytes.
  line = boundary_stats.count(actions, mask, refs['line'])
  word = boundary_stats.count(actions, mask, refs['word_end'])
  out = {
      'rate': ws.rate,
      'bytes_per_chunk': 1.0 / jnp.maximum(ws.rate, 1e-6),
      'whitespace_recall': ws.recall,
      'whitespace_precision': ws.precision,
      'line_precision': line.precision,
      'word_end_recall': word.recall,
  }
  if dropped is not None:
    out['overflow'] = jnp.sum(dropped) / jnp.maximum(jnp.sum(dropped) + jnp.sum(actions), 1.0)
    out['overflow_rows'] = jnp.mean(jnp.any(dropped > 0, axis=-1).astype(jnp.float32))
  return out


# fold_in salt of the counterfactual draws' keys: fold_in(key, COUNTERFACTUAL_KEY + s) for stage s,
# apart from the keys the model derives from the training draw's key (fold_in(key, s), small s).
COUNTERFACTUAL_KEY = 1 << 20


def counterfactual_stages(config, *, levels: stages.Levels) -> tuple[tuple[int, str], ...]:
  """(s, reward kind) of every stage of config's model whose score function uses a counterfactual
  reward; levels: config's (`stages.resolve`).

  Each costs one more forward pass per training step (the module docstring).
  """
  out = []
  for st in levels[: models.num_stages(config)]:
    kind = st.estimator.reward
    if models.trains_score_function(config, st) and estimator.counterfactual_mode(kind):
      out.append((st.level, kind))
  return tuple(out)


def counterfactual_ce(model, params, tokens, targets, mask, out, *, key, s: int, kind: str):
  """CE_cf of stage s: float32[B, L] nats (times mask), no gradient (the module docstring).

  tokens, targets, mask: [B, L] (every draw's rows); out: the training draw's `ModelOutput`, whose
  executed actions at stages 0..s-1 the counterfactual keeps.
  """
  n = model.num_stages
  modes = ('given',) * s + (estimator.counterfactual_mode(kind),) * (n - s)
  actions = tuple(out.stages[j].boundaries.actions for j in range(s)) + (None,) * (n - s)
  cf = model.apply(
      {'params': jax.lax.stop_gradient(params)},
      tokens,
      jax.random.fold_in(key, COUNTERFACTUAL_KEY + s),
      mode=modes,
      actions=jax.lax.stop_gradient(actions),
  )
  return jax.lax.stop_gradient(cross_entropy(cf.logits, targets)) * mask


def objective(config, model, mode: str = 'sample', *, levels: stages.Levels):
  """(params, batch, key, step) -> (loss, (metrics, ce float32[B, L])) for this config's model
  (`models.build_model(config, levels=levels)`); levels: config's (`stages.resolve`)."""
  if not model.num_stages:
    return functools.partial(flat_objective, model)
  return functools.partial(hierarchical_objective, model, cfg=config, levels=levels, mode=mode)


def flat_objective(model, params, batch, key, step):
  """Mean next-byte CE of the flat model. Returns (loss, (metrics, per-position CE float32[B, L]))."""
  del key, step
  mask = batch['mask']
  ce = cross_entropy(model.apply({'params': params}, batch['inputs']).logits, batch['targets'])
  loss = masked_mean(ce, mask)
  return loss, ({'loss': loss, 'bpb': loss / LN2}, ce * mask)


def hierarchical_objective(
    model, params, batch, key, step, *, cfg, levels: stages.Levels, mode='sample', actions=None
):
  """The paper's total loss for one batch with boundaries drawn by `mode` ('sample' in training).

  cfg: the full config, and levels its levels (`stages.resolve`): each stage's estimator settings
  apply when it trains with the score function (`models.trains_score_function`). actions: the executed actions of the stages `mode` gives ('given', or a tuple
  of one mode per stage), as the model's __call__ takes them (exact-enumeration tests); one draw per
  sequence only. Returns (loss, (metrics, CE_full float32[B, L])).
  """
  est = levels[0].estimator
  score_function = models.trains_score_function(cfg, levels[0])
  kwargs = {} if actions is None else {'actions': actions}
  if est.off_policy_steps > 0:
    kwargs['behavior'] = step < est.off_policy_steps
  draws = estimator.baseline(est.baseline).draws(est) if score_function else 1
  inputs, targets, mask = batch['inputs'], batch['targets'], batch['mask']
  if draws > 1:
    # `draws` boundary draws per sequence, one encoder pass; rows k*B + b. The LM loss averages over
    # all draws.
    out = model.apply(
        {'params': params}, inputs, key, draws, mode=mode, method='sample_k', **kwargs
    )
    ce_early = jnp.tile(cross_entropy(out.early_logits, targets) * mask, (draws, 1))
    tile = lambda x: jnp.tile(x, (draws, 1))
    inputs, targets, mask = tile(inputs), tile(targets), tile(mask)
  else:
    out = model.apply({'params': params}, inputs, key, mode=mode, **kwargs)
    ce_early = cross_entropy(out.early_logits, targets) * mask
  bnd = out.boundaries
  ce_full = cross_entropy(out.logits, targets) * mask
  loss_full, loss_early = masked_mean(ce_full, mask), masked_mean(ce_early, mask)
  inner = out.stages[1:]
  # Early exits: stage 0's, and with S stages the mean over the S heads (each trained by its CE).
  ce_early_inner = [cross_entropy(st.early_logits, targets) * mask for st in inner]
  loss_early_all = (loss_early + sum(masked_mean(c, mask) for c in ce_early_inner)) / (
      1 + len(inner)
  )
  loss = (1.0 - est.lambda_early) * loss_full + est.lambda_early * loss_early_all + bnd.aux_loss
  metrics = {'bpb': loss_full / LN2, 'bpb_early': loss_early / LN2}
  # Each stage's baseline CE: its early exit, or its counterfactual (one more forward pass each).
  ce_base = [ce_early] + ce_early_inner
  for s, kind in counterfactual_stages(cfg, levels=levels):
    ce_base[s] = counterfactual_ce(
        model, params, inputs, targets, mask, out, key=key, s=s, kind=kind
    )
    metrics[interface.stage_metric(s, 'bpb_counterfactual')] = masked_mean(ce_base[s], mask) / LN2
  if score_function:
    rl_loss, rl_metrics = estimator.score_function_terms(
        ce_full, ce_base[0], bnd, mask, est, values=out.values
    )
    loss = loss + rl_loss
    metrics.update(rl_metrics)
  metrics.update(boundary_metrics(inputs, bnd.actions, mask, bnd.dropped))
  metrics.update({k: v for k, v in bnd.stats.items() if jnp.ndim(v) == 0})
  for s, (st, ce_early_s) in enumerate(zip(inner, ce_early_inner), start=1):
    stage_loss, stage_metrics = inner_stage_terms(
        cfg, levels[s], st, ce_full, ce_early_s, mask, ce_base=ce_base[s]
    )
    loss = loss + stage_loss
    metrics.update({interface.stage_metric(s, k): v for k, v in stage_metrics.items()})
  metrics['loss'] = loss
  # CE of the first draw only: callers count bytes over the B rows of the batch.
  return loss, (metrics, ce_full[: batch['mask'].shape[0]])


def inner_stage_terms(cfg, level: stages.Stage, stage, ce_full, ce_early, mask, *, ce_base=None):
  """The losses and metrics of stage s >= 1 (`level`: its `tokjax.stages.Stage`, one of cfg's
  levels; `stage`: the model output's `StageOutput` s).

  ce_base: float32[B, L], the CE its reward is taken against (default ce_early, its early exit; its
  counterfactual's under a counterfactual reward).
  Returns (loss: scalar, metrics: dict of scalars): the method's auxiliary loss, its score-function
  terms against ce_base with its own settings (`tokjax.stages.Stage.estimator`, its target rate
  included; when its method trains with the score function) and its
  boundary statistics: rate per input position (per chunk of stage s - 1), bytes per chunk of stage
  s, alignment of its boundaries to whitespace and line ends, overflow.
  """
  bnd, valid = stage.boundaries, stage.valid.astype(jnp.float32)
  loss = bnd.aux_loss
  metrics = {'bpb_early': masked_mean(ce_early, mask) / LN2}
  if models.trains_score_function(cfg, level):
    rl_loss, rl_metrics = estimator.score_function_terms(
        ce_full,
        ce_early if ce_base is None else ce_base,
        bnd,
        mask,
        level.estimator,
        positions=stage.positions,
    )
    loss = loss + rl_loss
    metrics.update(rl_metrics)
  stats = boundary_metrics(stage.tokens, bnd.actions, valid, bnd.dropped * valid)
  # Recalls are per byte, not per chunk (see stage 0's); a word end needs the byte after it.
  for per_byte in ('whitespace_recall', 'word_end_recall'):
    del stats[per_byte]
  stats['bytes_per_chunk'] = jnp.sum(mask) / jnp.maximum(jnp.sum(bnd.actions * valid), 1.0)
  metrics.update(stats)
  metrics.update({k: v for k, v in bnd.stats.items() if jnp.ndim(v) == 0})
  return loss, metrics
