"""Evaluation of a model on the eval batches of a split: one loop, one definition of each statistic.

Used by training (val lines and metrics.jsonl), `python -m tokjax.evaluate` and the experiments.
The batches are `tokjax.data.pipeline.make_eval_batches`'s: each carries the stream position of its
rows, so every target byte is attributed to its document without re-deriving the batch order.

Statistics (per boundary mode; every ratio is pooled over the scored positions, not averaged over
batches):
  bpb      bits-per-byte pooled over bytes: sum of per-byte cross-entropy (nats) over the bytes of all
           documents / number of bytes / ln 2.
  bpb_se   the standard error of bpb by the ratio estimator with documents as the sampling unit
           (`ratio_and_se`); the label printed with it is `SE_LABEL`.
  rate, bytes_per_chunk, whitespace_{precision,recall,f1}, bpe_{precision,recall,f1}, chunk_hist
           boundary statistics over the positions whose target is a real byte (mask 1), forced
           boundaries included: the same positions as the training metrics of `losses.boundary_metrics`.
           A boundary after input byte t matches whitespace when byte t is whitespace, and matches BPE
           when byte t starts a BPE token (the shift of the BPE-guided rival).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tokjax import losses, sharding
from tokjax.data import pipeline

HIST_MAX = 32  # Chunks of HIST_MAX bytes or more share the last histogram bin.
SE_LABEL = '+- s.e. (ratio estimator over documents)'


def ratio_and_se(ce, nbytes) -> tuple[float, float]:
  """Bits-per-byte pooled over bytes and its standard error (ratio estimator, documents as units).

  Args:
    ce: float[D], each document's summed cross-entropy in nats.
    nbytes: float[D], each document's scored bytes; documents with none are left out.

  Returns:
    (bpb, se) with R = sum(ce) / sum(nbytes), bpb = R / ln 2 and
    se = sqrt(D / (D - 1) * sum_d (ce_d - R * nbytes_d)^2) / sum(nbytes) / ln 2 (NaN for D < 2).
  """
  ce, nbytes = np.asarray(ce, np.float64), np.asarray(nbytes, np.float64)
  keep = nbytes > 0
  ce, nbytes = ce[keep], nbytes[keep]
  d, total = len(ce), nbytes.sum()
  if d == 0:
    return float('nan'), float('nan')
  r = ce.sum() / total
  se = math.sqrt(d / (d - 1) * np.sum((ce - r * nbytes) ** 2)) / total if d > 1 else math.nan
  return float(r / math.log(2)), float(se / math.log(2))


def document_ids(docs) -> np.ndarray:
  """int32[len(packed stream)]: the document each position of `pipeline.pack_documents(docs)` is in."""
  return np.repeat(np.arange(len(docs), dtype=np.int32), [len(d) + 1 for d in docs])


def prf(hit, pred, ref) -> dict:
  """Precision hit / pred, recall hit / ref and their F1 (0 for an empty side)."""
  p, r = hit / max(pred, 1), hit / max(ref, 1)
  return {'precision': p, 'recall': r, 'f1': 2 * p * r / max(p + r, 1e-12)}


def _forward(model, kind, mode, params, batch, key):
  """-> (CE nats float32[B, L], zero where mask is 0; executed boundaries float32[B, L])."""
  if kind == 'flat':
    out = model.apply({'params': params}, batch['inputs'])
    actions = jnp.zeros(batch['inputs'].shape, jnp.float32)
  else:
    out = model.apply({'params': params}, batch['inputs'], key, mode=mode)
    actions = out['boundaries'].actions.astype(jnp.float32)
  return losses.cross_entropy(out['logits'], batch['targets']) * batch['mask'], actions


class Evaluator:
  """Evaluates params of a `train_state.Trainer`'s model on eval batches (see the module docstring).

  The forward of each mode is compiled once per Evaluator, with the trainer's parameter and batch
  shardings, so the trainer's val numbers and an inspected checkpoint's are the same computation.
  """

  def __init__(self, trainer):
    self.trainer = trainer
    self.config = trainer.config
    self.hierarchical = self.config.model.kind == 'hierarchical'
    self.modes = ('sample', 'greedy') if self.hierarchical else ('sample',)
    replicated = jax.sharding.NamedSharding(trainer.mesh, jax.sharding.PartitionSpec())
    self._forwards = {
        mode: jax.jit(
            functools.partial(_forward, trainer.model, self.config.model.kind, mode),
            in_shardings=(
                trainer.state_sharding.params,
                sharding.batch_sharding(trainer.mesh),
                replicated,
            ),
            out_shardings=replicated,
        )
        for mode in self.modes
    }

  def run(
      self, params, docs, key, *, batches=None, max_batches=None, modes=None, bpe_starts=None
  ) -> dict:
    """Evaluates the documents `docs` (one split) on `batches`.

    batches: `pipeline.make_eval_batches(docs, ...)`; default: made here with the config's seq_len
    and eval.batch_size, at most max_batches of them (None: all). Batch i draws its boundaries with fold_in(key, i). bpe_starts: optional bool[len(doc)] per
    document (BPE token starts) to score boundaries against. A flat model has only 'sample'.

    Returns:
      {mode: {'bpb', 'bpb_se', 'documents', 'bytes'} + for a hierarchical model 'rate',
      'bytes_per_chunk', 'whitespace_{precision,recall,f1}', 'chunk_hist' and, with bpe_starts,
      'bpe_{precision,recall,f1}'}.
    """
    modes = [m for m in (modes or self.modes) if m in self.modes]
    if batches is None:
      batches = pipeline.make_eval_batches(
          docs,
          seq_len=self.config.data.seq_len,
          batch_size=self.config.eval.batch_size,
          max_batches=max_batches,
      )
    doc_of = document_ids(docs)
    n = len(doc_of)
    bpe_stream = None
    if bpe_starts is not None:
      bpe_stream = np.concatenate([np.concatenate([[False], s]) for s in bpe_starts])
    return {
        mode: self._run_mode(params, mode, batches, key, doc_of, n, len(docs), bpe_stream)
        for mode in modes
    }

  def _run_mode(self, params, mode, batches, key, doc_of, n, num_docs, bpe_stream) -> dict:
    ce_doc, bytes_doc = np.zeros(num_docs), np.zeros(num_docs)
    counts = dict(scored=0, bnd=0, ws=0, ws_hit=0, bpe=0, bpe_hit=0)
    hist = np.zeros(HIST_MAX + 1, np.int64)
    for i, batch in enumerate(batches):
      placed = sharding.global_batch_from_global(pipeline.model_batch(batch), self.trainer.mesh)
      with sharding.use(self.trainer.mesh, self.config.mesh):
        out = self._forwards[mode](params, placed, jax.random.fold_in(key, i))
      ce, actions = jax.device_get(out)
      mask = batch['mask'] > 0
      pos = pipeline.stream_positions(batch)  # Input byte positions; target t sits at pos + 1.
      tdoc = doc_of[np.clip(pos + 1, 0, n - 1)][mask]
      ce_doc += np.bincount(tdoc, weights=ce[mask], minlength=num_docs)
      bytes_doc += np.bincount(tdoc, minlength=num_docs)
      if not self.hierarchical:
        continue
      a = (actions > 0.5) & mask
      ws = np.isin(batch['inputs'], losses.WHITESPACE) & mask
      counts['scored'] += mask.sum()
      counts['bnd'] += a.sum()
      counts['ws'] += ws.sum()
      counts['ws_hit'] += (a & ws).sum()
      if bpe_stream is not None:
        ref = bpe_stream[np.clip(pos, 0, n - 1)] & mask
        counts['bpe'] += ref.sum()
        counts['bpe_hit'] += (a & ref).sum()
      for row in a:
        lengths = np.diff(np.flatnonzero(row))
        hist += np.bincount(np.minimum(lengths, HIST_MAX), minlength=HIST_MAX + 1)
    bpb, se = ratio_and_se(ce_doc, bytes_doc)
    m = {
        'bpb': bpb,
        'bpb_se': se,
        'documents': int(np.sum(bytes_doc > 0)),
        'bytes': int(bytes_doc.sum()),
    }
    if self.hierarchical:
      m['rate'] = float(counts['bnd'] / max(counts['scored'], 1))
      m['bytes_per_chunk'] = 1.0 / m['rate'] if m['rate'] > 0 else float('inf')
      refs = [('whitespace', 'ws')] + ([('bpe', 'bpe')] if bpe_stream is not None else [])
      for name, c in refs:
        scores = prf(counts[f'{c}_hit'], counts['bnd'], counts[c])
        m.update({f'{name}_{k}': float(v) for k, v in scores.items()})
      m['chunk_hist'] = {
          (f'{k}+' if k == HIST_MAX else str(k)): int(c) for k, c in enumerate(hist) if c
      }
    return m


def scalars(results: dict) -> dict:
  """{mode: metrics} -> one flat dict of numbers: 'sample' keys bare, other modes prefixed."""
  out = {}
  for mode, m in results.items():
    prefix = '' if mode == 'sample' else f'{mode}_'
    out.update({prefix + k: v for k, v in m.items() if isinstance(v, (int, float))})
  return out


def format_bpb(bpb: float, se: float, digits: int = 4) -> str:
  """'1.2345 +- 0.0123 s.e. (ratio estimator over documents)'; without a standard error (fewer than
  two documents) '1.2345 (one document: no s.e.)'."""
  if math.isnan(se):
    return f'{bpb:.{digits}f} (one document: no s.e.)'
  return f'{bpb:.{digits}f} +- {se:.{digits}f} s.e. (ratio estimator over documents)'
