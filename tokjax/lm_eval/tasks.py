"""Running lm-eval tasks on a tokjax checkpoint, and the continuation bits-per-byte of each sample.

Scores, per task (the JSON's results[task], the printed table):
  - lm-eval's own metrics of the task: acc (the choice of highest log-likelihood), acc_norm (the same
    per byte of the choice: lm-eval normalises by the choice's length in bytes of UTF-8), acc_bytes
    where the task asks for it, perplexity and acc of LAMBADA-style tasks, word_perplexity,
    byte_perplexity and bits_per_byte of rolling tasks (pooled over the task's bytes), exact_match of
    generative ones;
  - cont_bpb: per sample, the bits-per-byte of the correct continuation, -log2 p(continuation |
    context) / its length in UTF-8 bytes (lm-eval's leading space included; for a rolling task the
    whole document), averaged over samples with its standard error (sample s.d. / sqrt(n)).
    Generative tasks have none.
"""

import math
import os

import numpy as np

from tokjax.errors import UserError

CONT_BPB = 'cont_bpb'


def sample_continuation_bpb(sample: dict) -> float | None:
  """The bits-per-byte of the correct continuation of one logged lm-eval sample (None for a
  generative task). sample: an entry of simple_evaluate(...)['samples'][task]."""
  args, resps = sample['arguments'], sample['filtered_resps']
  if not args or isinstance(args[0][1] if len(args[0]) > 1 else None, dict):
    return None  # generate_until: (context, generation kwargs).
  if len(args[0]) == 1:  # loglikelihood_rolling: (text,) -> log-likelihood.
    text, ll = args[0][0], resps[0]
  else:
    gold = sample['target']
    if len(args) > 1:  # multiple_choice: one (context, choice) per choice, target = gold index.
      gold = gold[0] if isinstance(gold, (list, tuple)) else gold
      i = int(gold)
    else:
      i = 0
    text, ll = args[i][1], resps[i][0]
  n = len(text.encode('utf-8'))
  return -float(ll) / math.log(2) / n if n else None


def continuation_bpb(samples: list[dict]) -> dict | None:
  """{'mean', 'se', 'n', 'per_sample'} of `sample_continuation_bpb` over a task's samples."""
  values = [v for v in map(sample_continuation_bpb, samples) if v is not None]
  if not values:
    return None
  x = np.asarray(values)
  se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan
  return {'mean': float(x.mean()), 'se': se, 'n': len(x), 'per_sample': values}


def task_manager(include_path=None):
  """lm-eval's TaskManager, with the task folders include_path (a path, or several joined by ':')."""
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top

  paths = [p for p in (include_path or '').split(':') if p]
  return TaskManager(include_path=paths or None)


def check_tasks(manager, names: list[str]) -> None:
  """UserError naming the tasks lm-eval does not know (with the include path in effect)."""
  known = set(manager.all_tasks)
  unknown = [n for n in names if n not in known]
  if unknown:
    raise UserError(
        f'unknown task(s) {", ".join(unknown)}: not among lm-eval\'s {len(known)} tasks and groups; '
        'check the name (`lm_eval ls tasks`) or pass the folder of your task YAML with --include_path.'
    )


def evaluate(lm, names: list[str], manager, limit=None, seed: int = 0) -> dict:
  """Runs the tasks on lm (a `tokjax.lm_eval.model.TokjaxLM`) through lm_eval.simple_evaluate, adds
  cont_bpb to each task's results, and returns {'results', 'cont_bpb', 'versions', 'n-shot',
  'configs'} (JSON-ready)."""
  import lm_eval  # pylint: disable=g-import-not-at-top

  check_tasks(manager, names)
  # lm-eval's bootstrap forks a process pool unless told not to; forking a JAX process can deadlock.
  os.environ.setdefault('DISABLE_MULTIPROC', '1')
  res = lm_eval.simple_evaluate(
      model=lm,
      tasks=names,
      task_manager=manager,
      limit=limit,
      log_samples=True,
      random_seed=seed,
      numpy_random_seed=seed,
      fewshot_random_seed=seed,
      bootstrap_iters=1000,
  )
  bpb = {}
  for task, samples in res['samples'].items():
    stats = continuation_bpb(samples)
    if stats is None:
      continue
    bpb[task] = stats
    res['results'][task][f'{CONT_BPB},none'] = stats['mean']
    res['results'][task][f'{CONT_BPB}_stderr,none'] = stats['se']
    res.setdefault('higher_is_better', {}).setdefault(task, {})[CONT_BPB] = False
  keep = ('results', 'versions', 'n-shot', 'configs', 'higher_is_better', 'n-samples')
  out = {k: res[k] for k in keep if k in res}
  out['cont_bpb'] = bpb
  return out


def table(report: dict) -> str:
  """lm-eval's results table (markdown) of `evaluate`'s report, cont_bpb among the metrics."""
  from lm_eval.utils import make_table  # pylint: disable=g-import-not-at-top

  return make_table(report)
