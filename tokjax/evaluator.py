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
  unit_ce, unit_bytes
           per scoring unit (a document, or with `unit_bytes=W` each fixed window of W bytes of a
           document, in order), the summed cross-entropy in nats and the number of scored bytes:
           what paired comparisons of two models on the same units need (`paired_difference`);
           unit_documents: the document of each unit, to cluster those comparisons by document.
  rate, bytes_per_chunk, whitespace_{precision,recall,f1}, bpe_{precision,recall,f1}, chunk_hist
           boundary statistics over the positions whose target is a real byte (mask 1), forced
           boundaries included: the same positions as the training metrics of `losses.boundary_metrics`.
           A boundary after input byte t matches whitespace when byte t is whitespace, and matches BPE
           when byte t starts a BPE token (the shift of the BPE-guided rival).
  line_{precision,recall}
           the same against newline bytes: boundaries that end a line, and lines ended by a boundary.
           Every boundary statistic is a `tokjax.boundary_stats.Counts` ratio, the training
           metrics' definition; a caller's own references (`run(references=...)`) add
           {name}_{precision,recall,f1} at every level.
  stage{s}_* (models with S > 1 stages, s = 1..S-1) the same statistics of stage s's chunk ends on
           bytes (`interface.boundaries_in_bytes`): rate is per chunk of stage s - 1 (stage s's
           input positions, as the training metric stage{s}_rate), bytes_per_chunk is bytes per
           stage-s chunk, whitespace_*, line_* and chunk_hist as above; no BPE scores (the BPE
           reference is fitted to stage 0's rate).
  stage{s}_{whitespace,line}_lift, ..._lift_se
           (S > 1) whether stage s places its ends or merely inherits them: its precision against
           the reference minus stage s - 1's, both over chunk ends at unforced positions (columns
           1..L-2 of a row; the first and last end a chunk at every level), paired over documents
           (`paired_share_difference`). A stage-s end can only sit where a stage-(s - 1) end does,
           so a stage s that picks among them at random has lift 0.
"""

import functools
import math

import jax
import numpy as np

from tokjax import boundary_stats, losses, sharding
from tokjax.data import pipeline
from tokjax.models import interface

PRF = ('precision', 'recall', 'f1')  # The statistics of a reference with an F1 (not line ends).
SE_LABEL = '+- s.e. (ratio estimator over documents)'
LIFT_REFERENCES = ('whitespace', 'line')  # The references of the stage-s lifts.


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


def share_and_se(num, den) -> tuple[float, float]:
  """sum(num) / sum(den) over documents and its ratio-estimator standard error (documents as
  units; `ratio_and_se`, whose bits-per-byte scaling by 1 / ln 2 is undone here)."""
  r, se = ratio_and_se(num, den)
  return r * math.log(2), se * math.log(2)


def paired_share_difference(num_a, den_a, num_b, den_b) -> tuple[float, float]:
  """R_a - R_b of two shares over the same documents (R = sum(num) / sum(den)) and its standard
  error: the ratio estimator's linearisation z_d = (num_a - R_a den_a) / sum(den_a) - (the same of
  b), se = sqrt(D / (D - 1) sum_d z_d^2). Documents where either den is 0 still count (z_d from the
  other side); NaN when a side has no denominator at all."""
  num_a, den_a, num_b, den_b = (np.asarray(x, np.float64) for x in (num_a, den_a, num_b, den_b))
  if den_a.sum() == 0 or den_b.sum() == 0:  # A side without ends has no share to compare.
    return math.nan, math.nan
  ra, rb = num_a.sum() / den_a.sum(), num_b.sum() / den_b.sum()
  z = (num_a - ra * den_a) / den_a.sum() - (num_b - rb * den_b) / den_b.sum()
  d = len(z)
  return float(ra - rb), float(math.sqrt(d / (d - 1) * np.sum(z**2))) if d > 1 else math.nan


def document_ids(docs) -> np.ndarray:
  """int32[len(packed stream)]: the document each position of `pipeline.pack_documents(docs)` is in."""
  return np.repeat(np.arange(len(docs), dtype=np.int32), [len(d) + 1 for d in docs])


def unit_ids(docs, unit_bytes: int = 0) -> tuple[np.ndarray, int]:
  """(int32[len(packed stream)], number of units): the scoring unit of each stream position.

  With unit_bytes = 0 a unit is a document (`document_ids`). With unit_bytes = W > 0 each document's
  positions 0..len (BOS first) are cut into consecutive windows of W, so a document of n bytes has
  ceil((n + 1) / W) units; a unit never spans two documents, and a target byte belongs to the unit of
  its own position, so the units' CE sums to the documents'.
  """
  if not unit_bytes:
    return document_ids(docs), len(docs)
  lengths, per_doc = _units_per_document(docs, unit_bytes)
  first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
  offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  return (np.repeat(first, lengths) + offset // unit_bytes).astype(np.int32), int(per_doc.sum())


def _units_per_document(docs, unit_bytes: int) -> tuple[np.ndarray, np.ndarray]:
  """(int64[D] stream positions of each document, BOS included; int64[D] its windows of
  unit_bytes)."""
  lengths = np.array([len(d) + 1 for d in docs], np.int64)
  return lengths, -(-lengths // unit_bytes)


def unit_documents(docs, unit_bytes: int = 0) -> np.ndarray:
  """int32[U]: the document of each unit of `unit_ids(docs, unit_bytes)`, to sum units into
  documents (a unit never spans two)."""
  if not unit_bytes:
    return np.arange(len(docs), dtype=np.int32)
  _, per_doc = _units_per_document(docs, unit_bytes)
  return np.repeat(np.arange(len(docs), dtype=np.int32), per_doc)


def paired_difference(ce_a, ce_b, nbytes, documents=None) -> dict:
  """Model a minus model b in bits-per-byte on the same units, with its paired standard errors.

  Args:
    ce_a, ce_b: float[U], each unit's summed cross-entropy in nats under a and under b.
    nbytes: float[U], each unit's scored bytes (the same for both); units with none are left out.
    documents: optional int[U], the document of each unit (`unit_documents`).

  Returns:
    {'diff': bpb(a) - bpb(b) (pooled over bytes), 'se': its standard error by the ratio estimator on
    the per-unit differences ce_a - ce_b (`ratio_and_se`), 'a_better': the share of units on which
    a has the lower cross-entropy, 'b_better': the same for b, 'units': U}; with documents also
    'clustered_se', the same estimator on the differences summed per document, and 'documents'.
    Because both models are scored on the same units, the variation between units that both share
    cancels: se is usually far below either model's own bpb_se. The windows of one document share
    its topic, style and length, so their differences are correlated and se, which treats them as
    independent, is too small by about sqrt(1 + (m - 1) rho) for m windows of correlation rho:
    clustered_se is the error to judge a difference by.
  """
  ce_a, ce_b = np.asarray(ce_a, np.float64), np.asarray(ce_b, np.float64)
  nbytes = np.asarray(nbytes, np.float64)
  if not ce_a.shape == ce_b.shape == nbytes.shape:
    raise ValueError(f'unit counts differ: {ce_a.shape}, {ce_b.shape}, {nbytes.shape}')
  keep = nbytes > 0
  diff, se = ratio_and_se(ce_a[keep] - ce_b[keep], nbytes[keep])
  units = int(keep.sum())
  out = {
      'diff': diff,
      'se': se,
      'a_better': float(np.mean(ce_a[keep] < ce_b[keep])) if units else math.nan,
      'b_better': float(np.mean(ce_b[keep] < ce_a[keep])) if units else math.nan,
      'units': units,
  }
  if documents is not None:
    documents = np.asarray(documents, np.int64)
    if documents.shape != nbytes.shape:
      raise ValueError(f'{documents.shape} document ids for {nbytes.shape} units')
    per_doc = lambda x: np.bincount(documents, weights=x)
    doc_bytes = per_doc(nbytes)
    out['clustered_se'] = ratio_and_se(per_doc(ce_a - ce_b), doc_bytes)[1]
    out['documents'] = int(np.sum(doc_bytes > 0))
  return out


FOUND_BY = 2.0  # A difference is found when it exceeds this many of `judged_se`'s errors.


def judged_se(clustered_se: float, seed_se: float | None) -> float:
  """The error a paired difference is judged by: the larger of its document-clustered error
  (`paired_difference`) and the standard error of its per-seed differences (None: one seed, which
  has none, and the clustered error stands alone)."""
  return clustered_se if seed_se is None else max(clustered_se, seed_se)


def verdict(diff: float, clustered_se: float, seed_se: float | None) -> str:
  """'found' when |diff| > FOUND_BY x `judged_se` with two seeds or more; 'one seed' when it
  exceeds FOUND_BY clustered errors but a single seed leaves the seed error unknown; else 'not
  found' (inside the errors, or an error is NaN)."""
  if not abs(diff) > FOUND_BY * judged_se(clustered_se, seed_se):
    return 'not found'
  return 'one seed' if seed_se is None else 'found'


def _forward(model, mode, params, batch, key):
  """-> (CE nats float32[B, L], zero where mask is 0; executed boundaries of every stage on bytes
  float32[B, S, L] (`interface.levels_on_bytes`: one level of zeros for a model without stages))."""
  out = model.apply({'params': params}, batch['inputs'], key, mode=mode)
  ce = losses.cross_entropy(out.logits, batch['targets']) * batch['mask']
  return ce, interface.levels_on_bytes(out)


class Evaluator:
  """Evaluates params of a `train_state.Trainer`'s model on eval batches (see the module docstring).

  The forward of each mode is compiled once per Evaluator, with the trainer's parameter and batch
  shardings, so the trainer's val numbers and an inspected checkpoint's are the same computation.
  """

  def __init__(self, trainer):
    self.trainer = trainer
    self.config = trainer.config
    self.has_boundaries = trainer.model.num_stages > 0
    self.modes = trainer.model.boundary_modes
    replicated = jax.sharding.NamedSharding(trainer.mesh, jax.sharding.PartitionSpec())
    self._forwards = {
        mode: jax.jit(
            functools.partial(_forward, trainer.model, mode),
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
      self,
      params,
      docs,
      key,
      *,
      batches=None,
      max_batches=None,
      modes=None,
      bpe_starts=None,
      unit_bytes=0,
      references=None,
      counts=False,
  ) -> dict:
    """Evaluates the documents `docs` (one split) on `batches`.

    batches: `pipeline.make_eval_batches(docs, ...)`; default: made here with the config's seq_len
    and eval.batch_size, at most max_batches of them (None: all). Batch i draws its boundaries with
    fold_in(key, i). bpe_starts: optional bool[len(doc)] per document (BPE token starts) to score
    stage 0's boundaries against. references: optional {name: `boundary_stats.Reference`} scored at
    every level besides the builtin ones (whitespace, line), e.g. an experiment's own. counts: also
    return the sums behind the boundary statistics. A flat model has only 'sample'.

    Returns:
      {mode: {'bpb', 'bpb_se', 'documents', 'bytes', 'unit_ce', 'unit_bytes', 'unit_documents'} +
      for a hierarchical model 'rate',
      'bytes_per_chunk', 'whitespace_{precision,recall,f1}', 'line_{precision,recall}', 'chunk_hist'
      and, with bpe_starts, 'bpe_{precision,recall,f1}'; with S > 1 stages the same boundary
      statistics (BPE's aside) of each stage s >= 1 prefixed 'stage{s}_' (see the module docstring);
      with references, '{name}_{precision,recall,f1}' of each at every level; with counts (and a
      hierarchical model), 'counts': per level, {reference name: `boundary_stats.Counts`}}.
    """
    if references and 'bpe' in references:
      raise ValueError("'bpe' is the reference of bpe_starts; give yours another name.")
    modes = [m for m in (modes or self.modes) if m in self.modes]
    if batches is None:
      batches = pipeline.make_eval_batches(
          docs,
          seq_len=self.config.data.seq_len,
          batch_size=self.config.eval.batch_size,
          max_batches=max_batches,
      )
    doc_of = document_ids(docs)
    unit_of, num_units = unit_ids(docs, unit_bytes)
    refs = boundary_stats.with_references(references)
    bpe = boundary_stats.stream_reference(bpe_starts) if bpe_starts is not None else None
    args = (doc_of, len(doc_of), len(docs), refs, bpe, unit_of, num_units, counts)
    unit_doc = [int(x) for x in unit_documents(docs, unit_bytes)]
    out = {mode: self._run_mode(params, mode, batches, key, *args) for mode in modes}
    for m in out.values():
      m['unit_documents'] = unit_doc
    return out

  def _run_mode(
      self, params, mode, batches, key, doc_of, n, num_docs, refs, bpe, unit_of, num_units, counts
  ) -> dict:
    ce_doc, bytes_doc = np.zeros(num_docs), np.zeros(num_docs)
    ce_unit, bytes_unit = np.zeros(num_units), np.zeros(num_units)
    levels, hists = None, None  # Per level of boundaries: {reference: Counts}, chunk histogram.
    free_ends = None  # Per level: {'ends' or a LIFT_REFERENCES name: float[num_docs]} (the lifts).
    for i, batch in enumerate(batches):
      placed = sharding.global_batch_from_global(pipeline.model_batch(batch), self.trainer.mesh)
      with sharding.use(self.trainer.mesh, self.config.mesh):
        out = self._forwards[mode](params, placed, jax.random.fold_in(key, i))
      ce, actions = jax.device_get(out)
      mask = batch['mask'] > 0
      pos = pipeline.stream_positions(batch)  # Input byte positions; target t sits at pos + 1.
      target_pos = np.clip(pos + 1, 0, n - 1)[mask]
      tdoc, tunit = doc_of[target_pos], unit_of[target_pos]
      ce_doc += np.bincount(tdoc, weights=ce[mask], minlength=num_docs)
      bytes_doc += np.bincount(tdoc, minlength=num_docs)
      ce_unit += np.bincount(tunit, weights=ce[mask], minlength=num_units)
      bytes_unit += np.bincount(tunit, minlength=num_units)
      if not self.has_boundaries:
        continue
      marks = boundary_stats.masks(refs, batch['inputs'], pos)
      ends = [level > 0.5 for level in actions.swapaxes(0, 1)]
      batch_levels = [boundary_stats.count_all(e, mask, marks) for e in ends]
      if bpe is not None:  # Fitted to stage 0's rate: scored at level 0 only.
        batch_levels[0]['bpe'] = boundary_stats.count(ends[0], mask, bpe(batch['inputs'], pos))
      levels = boundary_stats.merge(levels, batch_levels)
      batch_hists = [boundary_stats.chunk_histogram(e & mask) for e in ends]
      hists = boundary_stats.merge(hists, batch_hists)
      if len(ends) > 1:
        free_ends = _add_free_ends(free_ends, ends, mask, marks, tdoc, num_docs)
    bpb, se = ratio_and_se(ce_doc, bytes_doc)
    m = {
        'bpb': bpb,
        'bpb_se': se,
        'documents': int(np.sum(bytes_doc > 0)),
        'bytes': int(bytes_doc.sum()),
        'unit_ce': [float(x) for x in ce_unit],
        'unit_bytes': [int(x) for x in bytes_unit],
    }
    if levels is None:
      return m
    rates = boundary_stats.level_rates(
        [c['whitespace'].ends for c in levels], levels[0]['whitespace'].valid
    )
    for s, (c, hist, rate) in enumerate(zip(levels, hists, rates)):
      # Stage s >= 1 decides once per chunk of stage s - 1: its rate is per such chunk.
      stats = {'rate': float(rate), 'bytes_per_chunk': float(c['whitespace'].bytes_per_chunk)}
      for name in [r for r in ('whitespace', 'word_end', 'bpe') if r in c]:
        stats.update({f'{name}_{k}': float(getattr(c[name], k)) for k in PRF})
      stats.update(line_precision=float(c['line'].precision), line_recall=float(c['line'].recall))
      for name in [r for r in refs if r not in boundary_stats.BUILTIN]:
        stats.update({f'{name}_{k}': float(getattr(c[name], k)) for k in PRF})
      stats['chunk_hist'] = boundary_stats.histogram_dict(hist)
      m.update({interface.stage_metric(s, k): v for k, v in stats.items()})
    scored = bytes_doc > 0
    for s in range(1, len(free_ends or ())):
      for name in LIFT_REFERENCES:
        lift, lift_se = paired_share_difference(
            *(free_ends[level][key][scored] for level in (s, s - 1) for key in (name, 'ends'))
        )
        m[interface.stage_metric(s, f'{name}_lift')] = lift
        m[interface.stage_metric(s, f'{name}_lift_se')] = lift_se
    if counts:
      m['counts'] = levels
    return m


def _add_free_ends(sums, ends, mask, marks, tdoc, num_docs) -> list:
  """sums (None at the first batch) plus one batch's chunk ends at unforced positions, per level and
  per document: 'ends' all of them, and each of LIFT_REFERENCES those on its marks. ends: one
  bool[B, L] per level; mask: bool[B, L]; tdoc: the document of each masked position, in order."""
  free = boundary_stats.unforced(mask) & mask
  batch = []
  for e in ends:
    at = e & free
    level = {'ends': at}
    level.update({name: at & marks[name] for name in LIFT_REFERENCES})
    batch.append(
        {k: np.bincount(tdoc, weights=v[mask], minlength=num_docs) for k, v in level.items()}
    )
  if sums is None:
    return batch
  return [{k: a[k] + b[k] for k in a} for a, b in zip(sums, batch)]


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
