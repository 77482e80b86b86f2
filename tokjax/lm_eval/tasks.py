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
    Generative tasks have none. The correct choice of a multiple-choice sample is found as lm-eval's
    own process_results finds it (`gold_index`); a task where it cannot be found keeps every other
    metric, and its cont_bpb is 'N/A' with the reason in report['cont_bpb'][task]['unscorable'].
"""

import math
import numbers
import os

from absl import logging
import numpy as np

from tokjax.errors import UserError

CONT_BPB = 'cont_bpb'


def gold_index(task, doc) -> int:
  """The index of the correct choice of a multiple_choice doc, found as lm-eval's
  ConfigurableTask.process_results finds it: from doc_to_text for a multiple_input task (winogrande:
  one context per choice, one continuation), else from doc_to_target; an integer is the index, a
  string the text of the choice, a list the correct choices (the first is taken). task: the lm-eval
  Task that scored doc. Raises ValueError when the gold is not among the choices (lm-eval counts
  such a sample wrong, with a warning)."""
  choices = task.doc_to_choice(doc)
  gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
  first = gold[0] if isinstance(gold, (list, tuple)) and len(gold) else gold
  if isinstance(first, str) and first in choices:
    return choices.index(first)
  if isinstance(first, numbers.Integral) and 0 <= int(first) < len(choices):
    return int(first)
  raise ValueError(f'its gold {gold!r} is not among its {len(choices)} choices')


def sample_continuation_bpb(sample: dict, gold: int = 0) -> float | None:
  """The bits-per-byte of the correct continuation of one logged lm-eval sample (None for a
  generative task). sample: an entry of simple_evaluate(...)['samples'][task]; gold: the index of
  the correct request of a multiple_choice sample (`gold_index`)."""
  args, resps = sample['arguments'], sample['filtered_resps']
  if not args or isinstance(args[0][1] if len(args[0]) > 1 else None, dict):
    return None  # generate_until: (context, generation kwargs).
  if len(args[0]) == 1:  # loglikelihood_rolling: (text,) -> log-likelihood.
    text, ll = args[0][0], resps[0]
  else:  # One (context, continuation) per choice; a loglikelihood task has one.
    text, ll = args[gold][1], resps[gold][0]
  n = len(text.encode('utf-8'))
  return -float(ll) / math.log(2) / n if n else None


def continuation_bpb(samples: list[dict], task) -> dict | None:
  """{'mean', 'se', 'n', 'per_sample'} of `sample_continuation_bpb` over a task's samples. task: the
  lm-eval Task that scored them. Raises ValueError when a sample's gold cannot be found."""
  choice = task.OUTPUT_TYPE == 'multiple_choice'
  values = []
  for s in samples:
    try:
      gold = gold_index(task, s['doc']) if choice else 0
    except ValueError as e:
      raise ValueError(f'doc {s["doc_id"]}: {e}') from None
    if (v := sample_continuation_bpb(s, gold)) is not None:
      values.append(v)
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


def load_tasks(manager, names: list[str]) -> tuple[list, dict]:
  """(the Task or Group of each name, to run as simple_evaluate(tasks=...); {task name: Task} of
  every task among them). Kept so that the gold of each sample is found by the task that scored it.
  """
  built, leaves = [], {}
  for name in names:
    loaded = manager.load(name)
    leaves.update(loaded['tasks'])
    groups = loaded['groups']
    built += [groups[name]] if name in groups else list(loaded['tasks'].values())
  return built, leaves


def evaluate(lm, names: list[str], manager, limit=None, seed: int = 0) -> dict:
  """Runs the tasks on lm (a `tokjax.lm_eval.model.TokjaxLM`) through lm_eval.simple_evaluate, adds
  cont_bpb to each task's results, and returns {'results', 'cont_bpb', 'versions', 'n-shot',
  'configs'} (JSON-ready)."""
  import lm_eval  # pylint: disable=g-import-not-at-top

  check_tasks(manager, names)
  built, loaded = load_tasks(manager, names)
  # lm-eval's bootstrap forks a process pool unless told not to; forking a JAX process can deadlock.
  os.environ.setdefault('DISABLE_MULTIPROC', '1')
  res = lm_eval.simple_evaluate(
      model=lm,
      tasks=built,
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
    try:
      stats = continuation_bpb(samples, loaded[task])
    # The whole run's scores are in hand: whatever a task's own code raises costs only its cont_bpb.
    except Exception as e:  # pylint: disable=broad-exception-caught
      reason = ' '.join(f'{type(e).__name__}: {e}'.split())
      logging.warning('%s: cont_bpb not reported, its gold cannot be found: %s', task, reason)
      bpb[task] = {'unscorable': reason}
      res['results'][task][f'{CONT_BPB},none'] = 'N/A'
      continue
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
