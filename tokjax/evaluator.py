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

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np

from tokjax import boundary_stats, losses, sharding, significance
from tokjax.data import pipeline
from tokjax.models import interface

PRF = ('precision', 'recall', 'f1')  # The statistics of a reference with an F1 (not line ends).
LIFT_REFERENCES = ('whitespace', 'line')  # The references of the stage-s lifts.


@dataclasses.dataclass(frozen=True)
class Scoring:
  """What each mode of one `Evaluator.run` is scored against.

  doc_of: int[n], the document of each byte of the split's stream; num_docs: the documents;
  unit_of: int[n], the scoring unit of each byte, of num_units; refs: {name: reference} scored at
  every level; bpe: stage 0's BPE reference or None; subsets: {name: reference} of bytes whose own
  bits-per-byte to report; counts: also return the sums behind the boundary statistics.
  """

  doc_of: np.ndarray
  num_docs: int
  unit_of: np.ndarray
  num_units: int
  refs: dict
  bpe: Callable[..., Any] | None
  subsets: dict
  counts: bool

  @property
  def stream_bytes(self) -> int:
    return len(self.doc_of)


def _forward(model, mode, params, batch, key):
  """-> (CE nats float32[B, L], zero where mask is 0; executed boundaries of every stage on bytes
  float32[B, S, L] (`interface.levels_on_bytes`: one level of zeros for a model without stages)).
  Mode 'given' executes batch['actions'] at every stage."""
  given = {'actions': batch['actions']} if mode == 'given' else {}
  out = model.apply({'params': params}, batch['inputs'], key, mode=mode, **given)
  ce = losses.cross_entropy(out.logits, batch['targets']) * batch['mask']
  return ce, interface.levels_on_bytes(out)


class Evaluator:
  """Evaluates params of a `trainer.Trainer`'s model on eval batches (see the module docstring).

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
        for mode in self.modes + (('given',) if self.has_boundaries else ())
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
      given=None,
      subsets=None,
  ) -> dict:
    """Evaluates the documents `docs` (one split) on `batches`.

    batches: `pipeline.make_eval_batches(docs, ...)`; default: made here with the config's seq_len
    and eval.batch_size, at most max_batches of them (None: all). Batch i draws its boundaries with
    fold_in(key, i). bpe_starts: optional bool[len(doc)] per document (BPE token starts) to score
    stage 0's boundaries against. references: optional {name: `boundary_stats.Reference`} scored at
    every level besides the builtin ones (whitespace, line), e.g. an experiment's own. counts: also
    return the sums behind the boundary statistics. A flat model has only 'sample'.
    given: optional {name: `boundary_stats.Reference`}: also run the model on the boundaries each
    marks (executed at every stage, first and last positions forced as always), scored like a mode
    under its name. subsets: optional {name: bool[len(doc)] per document} marking bytes whose own
    bits-per-byte to report: '{name}_bpb', '{name}_bpb_se' (pooled over the marked bytes, standard
    error over documents as for bpb) and '{name}_bytes'.

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
    if given and (not self.has_boundaries or set(given) & set(self.modes)):
      raise ValueError(
          f'given boundaries need a model with boundaries and names besides {self.modes}.'
      )
    modes = [m for m in (modes or self.modes) if m in self.modes]
    if batches is None:
      batches = pipeline.make_eval_batches(
          docs,
          seq_len=self.config.data.seq_len,
          batch_size=self.config.eval.batch_size,
          max_batches=max_batches,
      )
    unit_of, num_units = significance.unit_ids(docs, unit_bytes)
    scoring = Scoring(
        doc_of=significance.document_ids(docs),
        num_docs=len(docs),
        unit_of=unit_of,
        num_units=num_units,
        refs=boundary_stats.with_references(references),
        bpe=boundary_stats.stream_reference(bpe_starts) if bpe_starts is not None else None,
        subsets={name: boundary_stats.stream_reference(m) for name, m in (subsets or {}).items()},
        counts=counts,
    )
    unit_doc = [int(x) for x in significance.unit_documents(docs, unit_bytes)]
    out = {mode: self._run_mode(params, mode, batches, key, scoring) for mode in modes}
    for name, marks in (given or {}).items():
      out[name] = self._run_mode(params, 'given', batches, key, scoring, given=marks)
    for m in out.values():
      m['unit_documents'] = unit_doc
    return out

  def _run_mode(self, params, mode, batches, key, scoring: Scoring, given=None) -> dict:
    """The statistics of one boundary mode ('given': on the boundaries `given` marks)."""
    sc = scoring
    doc_of, n, num_docs, refs, bpe = sc.doc_of, sc.stream_bytes, sc.num_docs, sc.refs, sc.bpe
    unit_of, num_units, counts, subs = sc.unit_of, sc.num_units, sc.counts, sc.subsets
    ce_doc, bytes_doc = np.zeros(num_docs), np.zeros(num_docs)
    ce_sub = {name: np.zeros((2, num_docs)) for name in subs}  # Per document: CE, bytes.
    ce_unit, bytes_unit = np.zeros(num_units), np.zeros(num_units)
    levels, hists = None, None  # Per level of boundaries: {reference: Counts}, chunk histogram.
    free_ends = None  # Per level: {'ends' or a LIFT_REFERENCES name: float[num_docs]} (the lifts).
    for i, batch in enumerate(batches):
      pos = pipeline.stream_positions(batch)  # Input byte positions; target t sits at pos + 1.
      model_in = pipeline.model_batch(batch)
      if given is not None:
        model_in['actions'] = np.asarray(given(batch['inputs'], pos), np.float32)
      placed = sharding.global_batch_from_global(model_in, self.trainer.mesh)
      with sharding.use(self.trainer.mesh, self.config.mesh):
        out = self._forwards[mode](params, placed, jax.random.fold_in(key, i))
      ce, actions = jax.device_get(out)
      mask = batch['mask'] > 0
      target_pos = np.clip(pos + 1, 0, n - 1)[mask]
      tdoc, tunit = doc_of[target_pos], unit_of[target_pos]
      ce_doc += np.bincount(tdoc, weights=ce[mask], minlength=num_docs)
      bytes_doc += np.bincount(tdoc, minlength=num_docs)
      ce_unit += np.bincount(tunit, weights=ce[mask], minlength=num_units)
      bytes_unit += np.bincount(tunit, minlength=num_units)
      for name, sub in subs.items():
        w = sub(batch['inputs'], pos + 1)[mask]  # The marks of the target bytes.
        ce_sub[name] += [
            np.bincount(tdoc, weights=x, minlength=num_docs) for x in (ce[mask] * w, w)
        ]
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
    bpb, se = significance.ratio_and_se(ce_doc, bytes_doc)
    m: dict[str, Any] = {
        'bpb': bpb,
        'bpb_se': se,
        'documents': int(np.sum(bytes_doc > 0)),
        'bytes': int(bytes_doc.sum()),
        'unit_ce': [float(x) for x in ce_unit],
        'unit_bytes': [int(x) for x in bytes_unit],
    }
    for name, (ce_s, bytes_s) in ce_sub.items():
      m[f'{name}_bpb'], m[f'{name}_bpb_se'] = significance.ratio_and_se(ce_s, bytes_s)
      m[f'{name}_bytes'] = int(bytes_s.sum())
    if levels is None:
      return m
    assert hists is not None  # Merged in the same batches as levels.
    rates = boundary_stats.level_rates(
        [c['whitespace'].ends for c in levels], levels[0]['whitespace'].valid
    )
    for s, (c, hist, rate) in enumerate(zip(levels, hists, rates)):
      # Stage s >= 1 decides once per chunk of stage s - 1: its rate is per such chunk.
      stats: dict[str, float | dict[str, int]] = {
          'rate': float(rate),
          'bytes_per_chunk': float(c['whitespace'].bytes_per_chunk),
      }
      for name in [r for r in ('whitespace', 'word_end', 'bpe') if r in c]:
        stats.update({f'{name}_{k}': float(getattr(c[name], k)) for k in PRF})
      stats.update(line_precision=float(c['line'].precision), line_recall=float(c['line'].recall))
      for name in [r for r in refs if r not in boundary_stats.BUILTIN]:
        stats.update({f'{name}_{k}': float(getattr(c[name], k)) for k in PRF})
      stats['chunk_hist'] = boundary_stats.histogram_dict(hist)
      m.update({interface.stage_metric(s, k): v for k, v in stats.items()})
    scored = bytes_doc > 0
    for s in range(1, len(free_ends or ())):
      assert free_ends is not None  # The range is empty otherwise.
      for name in LIFT_REFERENCES:
        lift, lift_se = significance.paired_share_difference(
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
