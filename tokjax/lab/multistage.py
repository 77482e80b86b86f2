r"""One stage against two stages of boundaries at equal training FLOPs, with statistics per level.

  python -m tokjax.lab.multistage --corpus shakespeare --steps 3000 --batch 4 --seq_len 1024 \
      --evals 6 --runs one_stage,learned,hnet --out results/multistage/shakespeare

Runs (`RUNS`): 'one_stage' (configs/compare.py:policy: bytes -> chunks, the score-function policy at
the library defaults) and the
two-stage variants of configs/two_stage.py: 'learned' (policy / policy), 'hnet' (H-Net's router at
both levels) and 'stride' (fixed stride at both levels). The one-stage run trains --steps steps; every
other run trains the steps that give it the same training FLOPs, costed by `tokjax.flops.step_flops`
at the configs' target rates (model FLOPs: the main network on rate x L chunks), so a second stage
is paid for with fewer steps. The realised FLOPs (at the rates the runs reach on test) are reported
beside them. Each run trains with `tokjax.train.train` in OUT/RUN (console in OUT/RUN/train.log; a
run whose OUT/RUN/result.json exists is not retrained, and one without its per-level statistics is
evaluated again), then is evaluated on the val and test documents (bits-per-byte with its standard
error over documents, `tokjax.evaluator`, boundaries sampled as in training) and per level of
boundaries on test (`level_summary` of the same evaluation's counts). Every run is scored on the
same bytes with the same boundary key, so each is compared to the one-stage run paired per window of
--unit_bytes bytes and clustered by document (`paired_rows`). A run stopped before its result.json
(Ctrl-C, a killed session) resumes from its last checkpoint when the same command is run again; each run may
also be started in its own process (`--runs learned`, pinned to its own core), and a last command
with every run writes the tables from their result.json files. OUT gets:
  README.md      the tables, the command, and one held-out passage per run with '|' after every
                 stage-0 chunk and '||' where a stage-1 chunk ends too (greedy boundaries)
  results.json   everything in the tables, per run, and the paired differences
"""

import math
import os
import sys

from absl import flags, logging
import jax

from tokjax import boundary_stats, cli, flops, inspection, significance, stages, tokenization
from tokjax.config import files as config_files
from tokjax.config import presets
from tokjax.data import corpora, pipeline
from tokjax.errors import UserError
from tokjax.lab import common

# run -> (configs/FILE.py, its variant or None, boundary methods per stage as shown in the tables).
RUNS = {
    'one_stage': ('compare', 'policy', 'policy'),
    'learned': ('two_stage', 'learned', 'policy / policy'),
    'hnet': ('two_stage', 'hnet', 'hnet / hnet'),
    'stride': ('two_stage', 'stride', 'stride / stride'),
}
BASE = 'one_stage'  # Its step count is the command's --steps; the others' follow from FLOPs.
# The held-out passage is shown with greedy boundaries (each p > 1/2) and with one sampled draw, as
# training and the bits-per-byte draw them: a policy still unsure of its boundaries (p < 1/2
# everywhere) shows none greedily.
PASSAGE_MODES = ('greedy', 'sample')


if __name__ == '__main__':  # Flags belong to the command; importing this module defines none.
  _CORPUS = flags.DEFINE_string(
      'corpus', 'shakespeare', 'Corpus spec (see tokjax/data/corpora.py).'
  )
  _OUT = flags.DEFINE_string('out', 'results/multistage/run', 'Results folder.')
  _STEPS = flags.DEFINE_integer(
      'steps', 150, 'Training steps of the one-stage run (the others: equal training FLOPs).'
  )
  _BATCH = flags.DEFINE_integer(
      'batch', 0, "Sequences per step of every run (0: configs/two_stage.py's, 4)."
  )
  _RUNS = flags.DEFINE_list('runs', ','.join(RUNS), 'Runs, from ' + ','.join(RUNS))
  _TINY = flags.DEFINE_bool('tiny', False, 'Tiny models and eval (smoke tests).')
  _EVAL_DOCS = flags.DEFINE_integer(
      'eval_docs', 0, 'Evaluate at most this many val and test documents (0 = all).'
  )
  _EVAL_DOC_BYTES = flags.DEFINE_integer(
      'eval_doc_bytes', 0, 'Evaluate at most this many bytes of each document (0 = whole).'
  )
  _EVALS = flags.DEFINE_integer('evals', 1, 'Val evaluations during training.')
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
  _SEQ_LEN = flags.DEFINE_integer(
      'seq_len', 0, "Bytes per sequence of every run (0: configs/two_stage.py's, 1024)."
  )
  _UNIT_BYTES = flags.DEFINE_integer(
      'unit_bytes', 2048, 'Paired differences are also taken over windows of this many bytes.'
  )


def run_config(
    run: str, corpus: str, tiny: bool = False, seed: int = 0, batch: int = 0, seq_len: int = 0
):
  """The config of `run` (a key of RUNS) with the command's corpus, seed, batch and seq_len (0:
  keep). Every chunk buffer grows with seq_len, so that it holds the same share of the sequence."""
  file, variant, _ = RUNS[run]
  if variant is None:
    c = config_files.load(file)
    if tiny:
      presets.tiny(c)
  else:
    c = config_files.load(file, f'{variant},tiny' if tiny else variant)
  c.data.corpus = corpus
  c.seed = seed
  if batch:
    c.data.batch_size = batch
  if seq_len:
    grow = lambda capacity: int(math.ceil(capacity * seq_len / c.data.seq_len))
    c.model.capacity = grow(c.model.capacity)
    for own in c.stages.values():  # A stage without its own buffer inherits the grown one.
      if own.model.capacity is not None:
        own.model.capacity = grow(own.model.capacity)
    c.data.seq_len = seq_len
  return c


def run_configs(runs, corpus: str, tiny=False, seed=0, batch=0, seq_len=0) -> dict:
  """{run: `run_config`} of BASE and `runs`, all on sequences of one shape: batch and seq_len, or
  where 0 configs/two_stage.py's (the one-stage config's shorter sequences are grown to it)."""
  shape = run_config('learned', corpus, tiny).data
  batch, seq_len = batch or shape.batch_size, seq_len or shape.seq_len
  return {
      r: run_config(r, corpus, tiny, seed, batch, seq_len) for r in dict.fromkeys((BASE, *runs))
  }


def target_rates(config) -> tuple[float, ...]:
  """Each stage's target rate: stage 0's per byte, stage s's per chunk of stage s - 1."""
  return tuple(float(st.target_rate) for st in stages.resolve(config))


def _step_flops(config, rates) -> float:
  """`flops.step_flops` of config at rates (one per stage)."""
  return flops.step_flops(config, rates, levels=stages.resolve(config))


def equal_flops_steps(configs: dict, base_steps: int, base: str = BASE) -> dict:
  """{run: steps} whose training FLOPs (`flops.step_flops` at the target rates) match base's
  base_steps steps; every run gets at least one step."""
  budget = _step_flops(configs[base], target_rates(configs[base])) * base_steps
  return {
      run: max(1, round(budget / _step_flops(c, target_rates(c)))) for run, c in configs.items()
  }


REFERENCES = {
    'phrase': boundary_stats.phrase_end
}  # Scored at every level besides the builtin ones.
# The per-level table: whitespace, word ends (a word's last byte before whitespace: the other side
# of the space), line ends ('\n') and phrase ends (`boundary_stats.phrase_end`).
LEVEL_REFERENCES = ('whitespace', 'word_end', 'line', 'phrase')


def level_summary(levels) -> list[dict]:
  """Per level s, from the Evaluator's counts ({reference: `boundary_stats.Counts`} per level):
  rate (boundaries per input position of stage s: per byte at s = 0, per stage-(s-1) chunk above),
  bytes_per_chunk, and the precision (fraction of its chunk ends that sit there) and recall
  (fraction of those bytes that end a level-s chunk) of each of `LEVEL_REFERENCES`, with each
  reference's share of bytes (`*_base`, the precision of boundaries placed at random) and the number
  of boundaries."""
  ws = [c['whitespace'] for c in levels]
  rates = boundary_stats.level_rates([c.ends for c in ws], ws[0].valid)
  out = []
  for c, rate in zip(levels, rates):
    ends = c['whitespace'].ends
    m = {
        'rate': float(rate),
        # Bytes over boundaries (not 1 / rate): results.json keeps its earlier numbers bit for bit.
        'bytes_per_chunk': float(c['whitespace'].valid / ends) if ends else float('inf'),
    }
    for name in LEVEL_REFERENCES:
      m.update(
          {f'{name}_precision': float(c[name].precision), f'{name}_recall': float(c[name].recall)}
      )
    m.update({f'{name}_base': float(c[name].base) for name in LEVEL_REFERENCES})
    m['boundaries'] = int(ends)
    out.append(m)
  return out


def passage_levels(ckpt, text: bytes, key, modes=PASSAGE_MODES) -> tuple[bytes, dict]:
  """Boundaries of every level on text's first seq_len - 1 bytes, drawn in each mode:
  (bytes shown, {mode: float32[S, n]})."""
  drawn = {
      m: tokenization.boundaries_for(
          ckpt.model, ckpt.params, text, ckpt.config.data.seq_len, key, m
      )
      for m in modes
  }
  return drawn[modes[0]][0], {m: actions for m, (_, actions, _) in drawn.items()}


def run_one(run, config, out_dir, splits, key, eval_cap, passage, unit_bytes) -> dict:
  """Trains (unless OUT/RUN/result.json exists) and evaluates one run -> its result dict."""
  workdir = os.path.join(out_dir, run)
  r = common.train_or_load(run, config, out_dir)
  if 'levels' not in r or r.get('unit_bytes') != unit_bytes:
    r = common.evaluate_splits(workdir, r, splits, key, eval_cap, passage, REFERENCES, unit_bytes)
    r['unit_bytes'] = unit_bytes
    # The per-level statistics come from the same pass as the test bits-per-byte.
    r['levels'] = level_summary(r['test'].pop('counts'))
    r['val'].pop('counts')
    common.save_result(out_dir, run, r)
  drawn = r['passage'].get('levels')
  if not isinstance(drawn, dict) or set(drawn) != set(PASSAGE_MODES):
    shown, levels = passage_levels(inspection.load_checkpoint(workdir), passage, key)
    r['passage']['levels'] = {m: [[float(a) for a in x] for x in v] for m, v in levels.items()}
    r['passage']['rendered_levels'] = {m: tokenization.render(shown, v) for m, v in levels.items()}
    common.save_result(out_dir, run, r)
  return r


def paired_rows(
    results, docs_by_split, unit_bytes, base=BASE, clusters_by_split=None
) -> list[dict]:
  """Each run minus `base` in bits-per-byte on the same val/test bytes, paired per window of
  unit_bytes bytes and clustered by the corpus's independent unit of each document
  (clusters_by_split: {split: `corpora.document_clusters`}; by document where it is None), judged by
  `significance.judge` with one seed (`common.paired_one_seed`) and Holm-adjusted over the runs of
  each split (one family a split): one dict per (run, split)."""
  by = {r['run']: r for r in results}
  if base not in by:
    return []
  rows = []
  for r in results:
    if r['run'] == base:
      continue
    for split, docs in docs_by_split.items():
      doc_clusters = (clusters_by_split or {}).get(split)
      d = common.paired_one_seed(r[split], by[base][split], docs, unit_bytes, doc_clusters)
      rows.append({'run': r['run'], 'base': base, 'split': split, 'unit': f'{unit_bytes} B', **d})
  return common.judge_families(rows, lambda p: f'{p["split"]} vs {base}')


def write_outputs(out_dir, results, meta, paired=()) -> None:
  """README.md (the tables and passages) and results.json."""
  fmt = common.fmt
  first = results[0]
  lines = [
      f'# One stage vs two stages of boundaries at equal training FLOPs (`{meta["corpus"]}`)',
      '',
      'Command:',
      '',
      f'    {meta["command"]}',
      '',
      f'Batch {meta["batch"]} x {meta["seq_len"]} bytes; the one-stage run trains '
      f'{meta["base_steps"]} steps and every other run the steps that give the same training FLOPs '
      '(tokjax.flops.step_flops at the target rates: planned TFLOPs). Realised TFLOPs: the same '
      'count at the rates each run reached on test. Bits-per-byte are pooled over the bytes of the '
      f'val/test documents, {significance.SE_LABEL}, boundaries sampled as in training ('
      + (f'first {meta["eval_docs"]} documents' if meta['eval_docs'] else 'all documents')
      + (f', first {meta["eval_doc_bytes"]} bytes of each' if meta['eval_doc_bytes'] else '')
      + '). Wall: training, on the machine and cores the command ran on.',
      '',
      *common.table(
          'run | stages | params | steps | planned TFLOPs | realised TFLOPs | val bpb +- s.e. | '
          'test bpb +- s.e. | wall s',
          (
              f'{r["run"]} | {r["stages"]} | {r["params"]:,} | {r["steps"]} | '
              f'{r["planned_flops"] / 1e12:.4g} | {r["realised_flops"] / 1e12:.4g} | '
              f'{fmt(v["bpb"], 4)} +- {fmt(v["bpb_se"], 4)} | {fmt(t["bpb"], 4)} +- '
              f'{fmt(t["bpb_se"], 4)} | {r["wall_s"]:.0f}'
              for r, v, t in ((r, r['val'], r['test']) for r in results)
          ),
      ),
  ]
  base = first['levels'][0]
  lines += [
      '',
      f'Val/test documents: {first["val"]["documents"]} / {first["test"]["documents"]} '
      f'({first["test"]["bytes"]:,} test bytes). The standard errors are per run; all runs score '
      'the same documents, so their differences are paired (next table).',
      '',
      '## Paired differences to the one-stage run',
      '',
      f'Run minus {BASE} in bits-per-byte on the same bytes, paired per window of '
      f'{meta["unit_bytes"]} bytes of each document, with the standard error over windows and over '
      "the corpus's independent units (clustered: the window differences summed per play or poem "
      'of Shakespeare, per source file of stdlib; ratio estimator). A difference is '
      f'{significance.RULE}. better: the share of windows on which each model has the lower '
      'cross-entropy.',
      '',
      *common.table(
          'run | split | windows | clusters | run - one_stage (bpb) | window s.e. | '
          'clustered s.e. | df | p | p (Holm) | verdict | run better | one_stage better',
          (
              f'{p["run"]} | {p["split"]} | {p["units"]} | {p["clusters"]} | {p["diff"]:+.4f} | '
              f'{fmt(p["se"], 4)} | {fmt(p["clustered_se"], 4)} | {fmt(p["df"], 1)} | '
              f'{significance.format_p(p["p"])} | {significance.format_p(p["p_holm"])} | '
              f'{p["verdict"]} | '
              f'{fmt(p["a_better"], 2)} | {fmt(p["b_better"], 2)}'
              for p in paired
          ),
      ),
      '',
      '## Boundaries per level (test, sampled)',
      '',
      'Level 0 ends chunks of bytes, level 1 chunks of level-0 chunks. rate: boundaries per input '
      'position of the level (per byte at level 0, per level-0 chunk at level 1). Precision: share '
      "of the level's chunk ends on whitespace / on a word's last byte before whitespace (word end: "
      'the other side of the space) / at a line end / at a phrase end (one of '
      f'`{bytes(boundary_stats.PHRASE_END).decode()}`, or whitespace right after one); recall: share of those bytes '
      'that end a chunk of the level. Chance precision (share of bytes): whitespace '
      f'{base["whitespace_base"]:.3f}, word end {base["word_end_base"]:.3f}, line end '
      f'{base["line_base"]:.3f}, phrase end '
      f'{base["phrase_base"]:.3f} at level 0; at level 1 the level-0 precision of the same run (a '
      'level-1 chunk can only end where a level-0 chunk ends, so that is what picking level-0 ends '
      'at random scores).',
      '',
      *common.table(
          'run | level | rate | bytes/chunk | ws prec | ws rec | word-end prec | word-end rec | '
          'line prec | line rec | phrase prec | phrase rec',
          (
              f'{r["run"]} | {s} | {fmt(m["rate"], 3)} | {fmt(m["bytes_per_chunk"], 2)} | '
              f'{fmt(m["whitespace_precision"], 3)} | {fmt(m["whitespace_recall"], 3)} | '
              f'{fmt(m["word_end_precision"], 3)} | {fmt(m["word_end_recall"], 3)} | '
              f'{fmt(m["line_precision"], 3)} | {fmt(m["line_recall"], 3)} | '
              f'{fmt(m["phrase_precision"], 3)} | {fmt(m["phrase_recall"], 3)}'
              for r in results
              for s, m in enumerate(r['levels'])
          ),
      ),
  ]
  lines += [
      '',
      '## One held-out passage per run',
      '',
      '`|` after each level-0 chunk, `||` where a level-1 chunk ends too; greedy boundaries (p > 1/2)'
      ', then one sampled draw (as in training and in the bits-per-byte above).',
      '',
  ]
  for r in results:
    lines += [f'### {r["run"]} ({r["stages"]})', '']
    for mode in PASSAGE_MODES:
      lines += [f'{mode}:', '', '```', r['passage']['rendered_levels'][mode], '```', '']
  data = {'meta': meta, 'runs': results, 'paired': list(paired)}
  common.write_results(out_dir, data, lines, markdown='README.md')


def multistage(
    corpus,
    base_steps,
    out_dir,
    runs=tuple(RUNS),
    tiny=False,
    eval_cap=(0, 0),
    evals=1,
    batch=0,
    command='',
    seed=0,
    seq_len=0,
    unit_bytes=2048,
):
  """Runs the comparison; returns the list of per-run result dicts (also written to out_dir)."""
  bad = [r for r in runs if r not in RUNS]
  if bad or not runs:
    raise UserError(f'unknown run(s) {bad}; --runs takes some of {",".join(RUNS)}.')
  if base_steps < 1:
    raise UserError(f'--steps={base_steps} must be a positive number of one-stage steps.')
  if unit_bytes < 1:
    raise UserError(f'--unit_bytes={unit_bytes} must be a positive number of bytes.')
  os.makedirs(out_dir, exist_ok=True)
  configs = run_configs(runs, corpus, tiny, seed, batch, seq_len)
  steps = equal_flops_steps(configs, base_steps)
  for r, c in configs.items():
    common.schedule(c, steps[r], evals)
  base = configs[BASE]
  splits = pipeline.load_splits(base.data, corpus)
  passage = common.paragraph(splits['test'], base.data.seq_len - 1)
  key = jax.random.PRNGKey(1234)
  results = []
  for run in runs:
    c = configs[run]
    planned = _step_flops(c, target_rates(c)) * steps[run]
    print(
        f'[multistage] {run} ({RUNS[run][2]}): {steps[run]} steps x '
        f'{_step_flops(c, target_rates(c)) / 1e9:.2f} GFLOPs at target rates '
        f'{target_rates(c)} = {planned / 1e12:.4g} TFLOPs',
        flush=True,
    )
    r = run_one(run, c, out_dir, splits, key, eval_cap, passage, unit_bytes)
    rates = tuple(m['rate'] for m in r['levels'])
    r.update(
        run=run,
        stages=RUNS[run][2],
        steps=steps[run],
        target_rates=target_rates(c),
        planned_flops=planned,
        realised_flops=_step_flops(c, rates) * steps[run],
    )
    print(
        f'[multistage] {run}: params {r["params"]:,} | test bpb '
        f'{significance.format_bpb(r["test"]["bpb"], r["test"]["bpb_se"])} | rates '
        + ' / '.join(f'{x:.3f}' for x in rates)
        + f' | realised {r["realised_flops"] / 1e12:.4g} TFLOPs | wall {r["wall_s"]:.0f}s',
        flush=True,
    )
    results.append(r)
  meta = {
      'corpus': corpus,
      'command': command,
      'base_steps': base_steps,
      'batch': base.data.batch_size,
      'seq_len': base.data.seq_len,
      'tiny': tiny,
      'eval_docs': eval_cap[0],
      'eval_doc_bytes': eval_cap[1],
      'unit_bytes': unit_bytes,
      'jax_devices': [str(d) for d in jax.devices()],
  }
  docs = {s: common.capped(splits[s], *eval_cap) for s in ('val', 'test')}
  clusters = None
  if not eval_cap[1]:  # Documents cut to a prefix are no longer the corpus's own.
    data_dir = base.data.data_dir or None
    clusters = {s: corpora.document_clusters(corpus, d, data_dir) for s, d in docs.items()}
  write_outputs(out_dir, results, meta, paired_rows(results, docs, unit_bytes, BASE, clusters))
  return results


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at INFO.
  command = 'python -m tokjax.lab.multistage ' + ' '.join(sys.argv[1:])
  multistage(
      _CORPUS.value,
      _STEPS.value,
      _OUT.value,
      _RUNS.value,
      _TINY.value,
      (_EVAL_DOCS.value, _EVAL_DOC_BYTES.value),
      _EVALS.value,
      _BATCH.value,
      command,
      _SEED.value,
      _SEQ_LEN.value,
      _UNIT_BYTES.value,
  )
  print(f'wrote {_OUT.value}/README.md, results.json')


if __name__ == '__main__':
  cli.run(main)
