r"""Generate text from a trained checkpoint, its chunk boundaries (if any) decided on the fly.

  python -m tokjax.sample --checkpoint DIR --prompt "def main(" [--num_bytes 200 --temperature 0.8
      --top_k 40 --seed 0 --boundaries sample|greedy --no_cache --compare]

Prints the prompt and its continuation with '|' after every chunk the model closed (the prompt's
chunks are the model's decisions too), and the generation speed in bytes per second (compilation
excluded). The default path keeps key/value caches (sliding-window caches for the byte layers, a chunk
cache for the chunk layers) so each byte costs one position's work; --no_cache reruns the whole model
on the full buffer for every byte; --compare runs both with the same key, checks that they produced the
same bytes and boundaries and prints both speeds. See tokjax/decoding.py.

Longer than the training seq_len (prompt + --num_bytes + 1 positions), generation slides the window
(`decoding.slide`: each later step reads the last seq_len // 2 + 1 bytes, with no BOS before cut
text, as training reads a window cut from a document; memory stays bounded for any --num_bytes) and prints the text as it is made; boundaries are shown within each step.

Every model generates: one stage of the learned policy with `decoding.generate`; several stages,
another boundary method or the flat model with `decoding.generate_stages`, which draws every level's
boundaries on the fly (a text of several stages is printed with '|' after a stage-0 chunk and '||'
where a stage-1 chunk ends too). Both are cached unless --no_cache. A boundary method that reads
bytes after t (registry `lookahead`, e.g. 'bpe_oracle') is refused: those bytes do not exist yet.
"""

import time

from absl import flags
import jax
import numpy as np

from tokjax import cli, decoding, inspection, tokenization
from tokjax import stages as stages_lib
from tokjax.errors import UserError
from tokjax.models import interface


def run_generation(
    model,
    params,
    prompt: bytes,
    num_bytes: int,
    key,
    *,
    mode: str,
    temperature: float,
    top_k: int,
    cached: bool,
) -> dict:
  """Compiles and runs `decoding.generation_fn(model)` (`decoding.generate` for one stage of the
  learned policy, `decoding.generate_stages` for every other model) once; returns its outputs, the text, its
  boundaries 'actions' float32[S, n] (every level on bytes), the chunk-marked text and the speed
  (bytes per second, compilation excluded)."""
  fn = decoding.generation_fn(model)
  tokens = decoding.encode_prompt(prompt)
  settings = {'mode': mode, 'temperature': temperature, 'top_k': top_k, 'cached': cached}
  t0 = time.perf_counter()
  compiled = fn.lower(model, params, tokens, key, num_bytes, **settings).compile()
  t1 = time.perf_counter()
  out = jax.block_until_ready(compiled(params, tokens, key))
  t2 = time.perf_counter()
  ids = np.asarray(out['tokens'][0, 1:])
  text = bytes(ids.astype(np.uint8).tolist())
  actions = tokenization.as_levels(np.asarray(out['actions'][0, ..., 1:]))
  return {
      'out': out,
      'text': text,
      'actions': actions,
      'marked': tokenization.render(text, actions),
      'compile_s': t1 - t0,
      'seconds': t2 - t1,
      'bytes_per_s': (len(prompt) + num_bytes) / max(t2 - t1, 1e-9),
  }


def stream_generation(
    model, params, prompt: bytes, num_bytes: int, key, *, mode, temperature, top_k, cached, window
):
  """`decoding.slide` for one prompt: yields (new bytes, their boundaries float32[S, n]) step by step,
  with buffers of at most `window` positions, so any num_bytes runs in memory O(window)."""
  steps = decoding.slide(
      model,
      params,
      [prompt],
      key,
      window=window,
      max_bytes=num_bytes,
      mode=mode,
      temperature=temperature,
      top_k=top_k,
      cached=cached,
  )
  for news in steps:
    yield news[0]


def define_flags():
  """The command-line flags (defined only when this module is the entry point)."""
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir).')
  flags.DEFINE_string('prompt', None, 'Text to continue.')
  flags.DEFINE_integer('num_bytes', 200, 'Bytes to generate.')
  flags.DEFINE_float('temperature', 0.8, 'Sampling temperature (0: most likely byte).')
  flags.DEFINE_integer('top_k', 40, 'Sample among the k most likely bytes (0: all).')
  flags.DEFINE_integer('seed', 0, 'Key of the boundary and byte draws.', lower_bound=0)
  flags.DEFINE_string(
      'boundaries', 'sample', 'Boundary decisions: sample (from the policy) or greedy.'
  )
  flags.DEFINE_bool('no_cache', False, 'Recompute the whole sequence for every byte.')
  flags.DEFINE_bool('compare', False, 'Run cached and uncached generation and compare them.')
  flags.DEFINE_integer(
      'step',
      None,
      'Checkpoint step that must load (default: the latest step that loads).',
      lower_bound=0,
  )


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: pass the run folder of a training run.')
  if f.prompt is None or not f.prompt:
    raise UserError('the prompt is empty; pass some text with --prompt="...".')
  try:
    prompt = f.prompt.encode('utf-8')
  except UnicodeEncodeError:  # Undecodable argv bytes arrive as lone surrogates.
    raise UserError(
        '--prompt is not valid UTF-8 text; pass it in UTF-8 (check the terminal encoding).'
    ) from None
  if f.num_bytes < 1:
    raise UserError(f'--num_bytes={f.num_bytes} must be at least 1.')
  if f.boundaries not in ('sample', 'greedy'):
    raise UserError(f'--boundaries={f.boundaries!r} is not valid; use sample or greedy.')
  if f.top_k < 0 or f.temperature < 0:
    raise UserError('--top_k and --temperature must not be negative.')
  # Before the model is built: a refused method needs no tokenizer or weights to say so. So the
  # saved config's levels are resolved here, apart from the run that load_checkpoint opens.
  saved = inspection.load_config(f.checkpoint)[0]
  decoding.check_causal(saved, levels=stages_lib.resolve(saved))
  ckpt = inspection.load_checkpoint(f.checkpoint, f.step)
  stages = interface.byte_levels(ckpt.model)
  header = 'flat model (no chunks)'
  if ckpt.model.num_stages:
    header = f'{f.boundaries} boundaries, {tokenization.legend(stages)}'
  total = len(prompt) + 1 + f.num_bytes
  seq_len = ckpt.config.data.seq_len
  key = jax.random.PRNGKey(f.seed)
  args = (ckpt.model, ckpt.params, prompt, f.num_bytes, key)
  settings = {'mode': f.boundaries, 'temperature': f.temperature, 'top_k': f.top_k}
  if total > seq_len:
    if f.compare:
      raise UserError(
          f'--compare needs prompt and continuation within the training seq_len {seq_len} '
          f'({total} positions asked); lower --num_bytes.'
      )
    print(
        f'note: {total} positions exceed the training seq_len {seq_len}: the window slides (each '
        f'later step reads the last {seq_len // 2 + 1} bytes).'
    )
    print(f'--- {header} ---')
    print(prompt.decode('utf-8', errors='replace'), end='', flush=True)
    t0, made = time.perf_counter(), 0
    for new, actions in stream_generation(*args, **settings, cached=not f.no_cache, window=seq_len):
      made += len(new)
      print(tokenization.render(new, actions, terminal=True), end='', flush=True)
    seconds = time.perf_counter() - t0
    print(f'\n---\n{made} bytes in {seconds:.1f} s (compilation included)')
    return
  paths = [True, False] if f.compare else [not f.no_cache]
  runs = {}
  for cached in paths:
    runs[cached] = run_generation(*args, **settings, cached=cached)
  res = runs[paths[0]]
  print(f'--- {header}; prompt: {len(prompt)} bytes ---')
  print(tokenization.render(res['text'], res['actions'], terminal=True))
  print('---')
  for cached, r in runs.items():
    name = 'cached' if cached else 'uncached'
    print(
        f'{name}: {r["bytes_per_s"]:.1f} bytes/s ({len(prompt) + f.num_bytes} bytes in '
        f'{r["seconds"]:.3f} s; compile {r["compile_s"]:.1f} s)'
    )
  if f.compare:
    a, b = runs[True], runs[False]
    same = a['text'] == b['text'] and np.array_equal(a['actions'], b['actions'])
    diff = float(np.max(np.abs(np.asarray(a['out']['logits']) - np.asarray(b['out']['logits']))))
    print(
        f'cached vs uncached: same bytes and boundaries: {same}; max |logit difference| {diff:.2e}; '
        f'speed-up {a["bytes_per_s"] / b["bytes_per_s"]:.1f}x'
    )


if __name__ == '__main__':
  define_flags()
  cli.run(main)
