"""The lm-evaluation-harness model `tokjax`: a tokjax checkpoint behind lm-eval's `LM` interface.

Importing this module registers it (`lm_eval --model tokjax` needs it imported: use
`python -m tokjax.lm_eval.harness`, lm-eval's own command with tokjax registered). It needs the
optional extra `pip install -e '.[eval]'`.

Requests are byte strings (UTF-8 of lm-eval's text, leading spaces included):
  - loglikelihood (context, continuation): the summed log-probability of the continuation's bytes
    after BOS + context (a context cut from the left: no BOS, see `scoring`), and whether every one
    is the argmax byte;
  - loglikelihood_rolling (text,): the log-probability of all its bytes, in rolling windows
    (`scoring.windows`);
  - generate_until (context, gen_kwargs): `decoding.slide` until a stop string (gen_kwargs 'until')
    or max_gen_toks bytes (default 256); greedy bytes unless do_sample with temperature > 0 (top_k
    read too). The text returned stops before the first stop string.
Boundaries: `scoring`'s module docstring (greedy, or sample with K draws).
"""

import jax
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from tokjax import decoding, inspection
from tokjax.errors import UserError
from tokjax.lm_eval import scoring

DEFAULT_MAX_GEN_BYTES = 256


def _int(name, value, default):
  if value is None or value == '':
    return default
  try:
    return int(value)
  except (TypeError, ValueError):
    raise UserError(f'{name}={value!r} must be an integer.') from None


@register_model('tokjax')
class TokjaxLM(LM):
  """model_args: checkpoint=RUN_FOLDER (required), step, boundaries=greedy|sample, draws=K,
  overlap (rolling-window context bytes, default seq_len // 2), seed (key of boundary and byte
  draws); batch_size comes from lm-eval's --batch_size (rows per forward, default 8; 'auto' means 8).
  """

  def __init__(
      self,
      checkpoint=None,
      *,
      step=None,
      boundaries='greedy',
      draws=1,
      overlap=None,
      seed=0,
      batch_size=None,
      max_batch_size=None,
      device=None,
      **unknown,
  ):
    super().__init__()
    del max_batch_size, device  # No batch-size search, devices are JAX's.
    if unknown:
      raise UserError(
          f'unknown model_args {sorted(unknown)} for tokjax; it takes checkpoint, step, boundaries, '
          'draws, overlap and seed.'
      )
    if not checkpoint:
      raise UserError('the tokjax model needs checkpoint=RUN_FOLDER (a training run folder).')
    batch = (
        8 if batch_size in (None, '', 'auto') or str(batch_size).startswith('auto') else batch_size
    )
    self.ckpt = inspection.load_checkpoint(str(checkpoint), _int('step', step, None))
    self.key = jax.random.PRNGKey(_int('seed', seed, 0))
    self.scorer = scoring.Scorer(
        self.ckpt,
        mode=str(boundaries),
        draws=_int('draws', draws, 1),
        batch_size=_int('batch_size', batch, 8),
        overlap=_int('overlap', overlap, None),
        key=self.key,
    )

  @property
  def seq_len(self) -> int:
    return self.scorer.seq_len

  def loglikelihood(self, requests, disable_tqdm: bool = False):
    del disable_tqdm
    pairs = [(c.encode('utf-8'), x.encode('utf-8')) for c, x in (r.args for r in requests)]
    scores = self.scorer.score([c + x for c, x in pairs], [len(c) for c, _ in pairs])
    out = []
    for r, s in zip(requests, scores):
      out.append((s.logprob, s.is_greedy))
      self.cache_hook.add_partial('loglikelihood', r.args, out[-1])
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
    del disable_tqdm
    texts = [r.args[0].encode('utf-8') for r in requests]
    scores = self.scorer.score(texts, [0] * len(texts))
    out = []
    for r, s in zip(requests, scores):
      out.append(s.logprob)
      self.cache_hook.add_partial('loglikelihood_rolling', r.args, s.logprob)
    return out

  def generate_until(self, requests, disable_tqdm: bool = False):
    del disable_tqdm
    decoding.check_causal(self.ckpt.config, levels=self.ckpt.levels)
    out: list[str | None] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}  # Requests with the same generation settings share batches.
    for i, r in enumerate(requests):
      kwargs = dict(r.args[1] or {})
      until = kwargs.get('until') or []
      until = [until] if isinstance(until, str) else list(until)
      greedy = not kwargs.get('do_sample', False) or float(kwargs.get('temperature', 0.0)) <= 0
      settings = (
          tuple(until),
          int(kwargs.get('max_gen_toks', DEFAULT_MAX_GEN_BYTES)),
          0.0 if greedy else float(kwargs.get('temperature', 1.0)),
          int(kwargs.get('top_k', 0) or 0),
      )
      groups.setdefault(settings, []).append(i)
    b = self.scorer.batch_size
    for (until, max_bytes, temperature, top_k), members in groups.items():
      for start in range(0, len(members), b):
        idx = members[start : start + b]
        texts = self._generate(
            [requests[i].args[0] for i in idx], until, max_bytes, temperature, top_k
        )
        for i, t in zip(idx, texts):
          out[i] = t
          self.cache_hook.add_partial('generate_until', requests[i].args, t)
    return out

  def _generate(self, contexts, until, max_bytes, temperature, top_k) -> list[str]:
    """The continuations of contexts (str), each cut before its first stop string."""
    prompts = [c.encode('utf-8') for c in contexts]  # An empty one: generation after BOS alone.
    count = len(prompts)
    # A short last batch is filled with copies: every batch has the compiled size.
    prompts += [prompts[0]] * (self.scorer.batch_size - count)
    made = [b''] * len(prompts)
    done = [False] * count + [True] * (len(prompts) - count)
    steps = decoding.slide(
        self.ckpt.model,
        self.ckpt.params,
        prompts,
        jax.random.fold_in(self.key, 1),
        window=self.seq_len,
        max_bytes=max_bytes,
        mode=self.scorer.forward_mode,
        temperature=temperature,
        top_k=top_k,
    )
    for news in steps:
      for j, (new, _) in enumerate(news):
        if done[j]:
          continue
        made[j] += new
        text = made[j].decode('utf-8', errors='ignore')
        done[j] = len(made[j]) >= max_bytes or any(s in text for s in until)
      if all(done):
        break
    out = []
    for m in made[:count]:
      text = m.decode('utf-8', errors='ignore')
      cut = min([text.find(s) for s in until if s in text] or [len(text)])
      out.append(text[:cut])
    return out
