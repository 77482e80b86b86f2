r"""Apply a trained model's learned tokenizer to a text file.

  python -m tokjax.segment --checkpoint DIR FILE [--out PREFIX] [--mode greedy|sample] [--delimiter '|']

Writes PREFIX.txt (the text with the delimiter after every chunk), PREFIX.json (chunk byte offsets
[start, end) that tile the file, and each byte's boundary probability), PREFIX.html (the text with each
character shaded by the boundary probability of its last byte and a bar after each chunk) and
PREFIX.png (a heatmap of the boundary probabilities of the first --png_bytes bytes). PREFIX defaults to
FILE's name under DIR/segment/.

A model with S > 1 stages shows every level: the .txt repeats the delimiter once per level ending at a
byte ('|' after a stage-0 chunk, '||' where a stage-1 chunk ends too), the .json adds
offsets_by_level, num_chunks_by_level and boundary_probs_by_level (entry s: stage s; each level's
offsets tile the file, entry 0 equals offsets), and the .html and .png draw a heavier bar at the end of
each stage-s chunk (s >= 1). The console lists the chunk count of every level.

Files longer than the model's seq_len are processed in overlapping windows: each window re-reads the
encoder's receptive field of already-decided bytes as context and keeps only the decisions of the
bytes after it, and never the window's forced last position (see `tokenization.segment_text`). For the
independent (w = 1) policy the result equals one pass over the whole file. Windows are cut as training
cuts a document: the first starts with BOS, every later one with cut text and no BOS.
"""

import json
import os

from absl import flags
import jax
import numpy as np

from tokjax import cli, inspection, paths, tokenization
from tokjax.errors import UserError


def read_text(path: str) -> bytes:
  if not os.path.isfile(path):
    raise UserError(f'{path} is not a file; pass the path of a text file to segment.')
  with open(path, 'rb') as f:
    text = f.read()
  if not text:
    raise UserError(f'{path} is empty; give a file with some text to segment.')
  return text


def utf8_spans(text: bytes) -> list[tuple[int, int]]:
  """[(start, end)] of the characters of text: valid UTF-8 sequences, or single stray bytes."""
  spans, i, n = [], 0, len(text)
  while i < n:
    b = text[i]
    size = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 1
    if size > 1:
      try:
        text[i : i + size].decode('utf-8')
      except UnicodeDecodeError:
        size = 1
    spans.append((i, min(i + size, n)))
    i += size
  return spans


# Bars at chunk ends in the .html and .png, by the highest level ending there (0: stage 0); dark
# colours, as the shading under them is red.
LEVEL_STYLES = (('#1a5fb4', 2, 'blue'), ('#000000', 4, 'black'), ('#26a269', 6, 'green'))


def level_style(level: int) -> tuple[str, int, str]:
  """(colour, width in px, colour name) of the bar after a chunk whose highest level is `level`."""
  return LEVEL_STYLES[min(level, len(LEVEL_STYLES) - 1)]


def level_legend(stages: int) -> str:
  """'2px blue at a stage-0 end, 4px black at a stage-1 end' for the .html and .png."""
  return ', '.join(
      f'{level_style(s)[1]}px {level_style(s)[2]} at a stage-{s} end' for s in range(stages)
  )


def to_html(text: bytes, actions, probs, title: str) -> str:
  """Characters shaded by the stage-0 boundary probability of their last byte; a bar ends each chunk,
  heavier where a chunk of a higher stage ends too. actions, probs: float[n] or float[S, n]."""
  import html  # pylint: disable=g-import-not-at-top

  levels = tokenization.as_levels(actions)
  probs = tokenization.as_levels(probs)[0]
  depth = np.sum(levels > 0.5, axis=0)
  parts = []
  for s, e in utf8_spans(text):
    ch = text[s:e].decode('utf-8', errors='replace')
    p = float(probs[e - 1])
    shown = {'\n': '&#8629;<br>', '\t': '&#8677;'}.get(ch, html.escape(ch).replace(' ', '&nbsp;'))
    cut = ''
    if levels[0, e - 1] > 0.5:
      cut = ' class="cut"' if depth[e - 1] == 1 else f' class="cut cut{depth[e - 1] - 1}"'
    parts.append(
        f'<span{cut} style="background:rgba(220,40,40,{p:.2f})" title="p={p:.2f}">'
        f'{shown}</span>'
    )
  higher = ''.join(
      f'.cut{s}{{border-right:{level_style(s)[1]}px solid {level_style(s)[0]}}}'
      for s in range(1, len(levels))
  )
  legend = 'a blue bar ends each chunk.'
  if len(levels) > 1:
    legend = f'a bar ends each chunk: {level_legend(len(levels))}.'
  return (
      f'<!doctype html><meta charset="utf-8"><title>{html.escape(title)}</title>'
      '<style>body{font-family:monospace;font-size:14px;line-height:1.7}'
      f'.cut{{border-right:2px solid #1a5fb4}}{higher}</style>'
      f"<p>{html.escape(title)}: shade = boundary probability of the character's last byte; "
      f'{legend}</p><div>' + ''.join(parts) + '</div>\n'
  )


def plot_heatmap(text: bytes, actions, probs, path: str, title: str, cols: int = 64) -> str:
  """PNG: bytes on a grid of `cols` columns coloured by the stage-0 boundary probability, chunk ends
  as bars (heavier and red, then black, where a stage-1, stage-2 chunk ends too). actions, probs:
  float[n] or float[S, n]."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  levels = tokenization.as_levels(actions)
  probs = tokenization.as_levels(probs)[0]
  depth = np.sum(levels > 0.5, axis=0)
  n = len(text)
  rows = -(-n // cols)
  grid = np.full(rows * cols, np.nan)
  grid[:n] = probs[:n]
  fig, ax = plt.subplots(figsize=(cols * 0.2 + 1.2, rows * 0.28 + 0.9))
  im = ax.imshow(grid.reshape(rows, cols), cmap='Reds', vmin=0, vmax=1, aspect='auto')
  for i in range(n):
    r, c = divmod(i, cols)
    b = text[i]
    ch = chr(b) if 32 < b < 127 else {32: '\u2423', 10: '\u21b5', 9: '\u21e5'}.get(b, '\u00b7')
    ax.text(c, r, ch, ha='center', va='center', fontsize=6.5, family='monospace')
    if levels[0, i] > 0.5:
      colour, width, _ = level_style(int(depth[i]) - 1)
      ax.plot([c + 0.5, c + 0.5], [r - 0.5, r + 0.5], color=colour, lw=1.3 * width / 2)
  ax.set_xticks([])
  ax.set_yticks(range(rows))
  ax.set_yticklabels([str(r * cols) for r in range(rows)], fontsize=6)
  if len(levels) > 1:
    title = f'{title}\nbars: {level_legend(len(levels))}'
  ax.set_title(title, fontsize=9)
  fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01, label='P(boundary)')
  fig.tight_layout()
  with paths.resolve(path).open('wb') as f:  # A local path or URL.
    fig.savefig(f, format='png', dpi=130)
  plt.close(fig)
  return path


def segment_file(
    checkpoint: str,
    file: str,
    out: str | None = None,
    *,
    mode: str = 'greedy',
    delimiter: str = '|',
    seed: int = 0,
    png_bytes: int = 1024,
    step: int | None = None,
) -> dict:
  """Segments `file` with the run's boundary methods; writes the four outputs; returns their paths,
  'offsets' (stage 0's), 'offsets_by_level' (one list per stage), 'actions' and 'probs' (float32[S, n])
  and 'text'."""
  if mode not in ('greedy', 'sample'):
    raise UserError(f'--mode={mode!r} is not valid; use greedy or sample.')
  text = read_text(file)
  # A local path or URL prefix; checked before the work, not after it.
  out = os.fspath(paths.join(checkpoint, 'segment', os.path.basename(file)) if out is None else out)
  paths.check_writable(out, '--out', '.txt')
  ckpt = inspection.load_checkpoint(checkpoint, step)
  config = ckpt.config
  if not ckpt.model.num_stages:
    raise UserError(
        f'{checkpoint} holds a flat model, which makes no chunks; pass a run of a '
        'hierarchical model.'
    )
  overlap = tokenization.window_overlap(config, levels=ckpt.levels)
  actions, probs = tokenization.segment_text(
      ckpt.model,
      ckpt.params,
      text,
      config.data.seq_len,
      jax.random.PRNGKey(seed),
      mode=mode,
      overlap=overlap,
  )
  by_level = [tokenization.chunk_offsets(actions, s) for s in range(len(actions))]
  offsets = by_level[0]
  paths.resolve(out).parent.mkdir(parents=True, exist_ok=True)
  title = f'{os.path.basename(file)}: {mode} boundaries of {checkpoint} (step {ckpt.step})'
  outputs = {k: f'{out}.{k}' for k in ('txt', 'json', 'html', 'png')}
  paths.write_text(outputs['txt'], tokenization.render(text, actions, delimiter))
  record = {
      'file': os.path.abspath(file),
      'checkpoint': paths.absolute(checkpoint),
      'step': ckpt.step,
      'mode': mode,
      'window_overlap': overlap,
      'seq_len': config.data.seq_len,
      'num_bytes': len(text),
      'num_chunks': len(offsets),
      'offsets': offsets,
      'boundary_probs': [round(float(p), 4) for p in probs[0]],
  }
  if len(by_level) > 1:  # Files of one-stage runs keep their format.
    record['stages'] = len(by_level)
    record['num_chunks_by_level'] = [len(o) for o in by_level]
    record['offsets_by_level'] = by_level
    record['boundary_probs_by_level'] = [[round(float(p), 4) for p in row] for row in probs]
  paths.write_text(outputs['json'], json.dumps(record))
  paths.write_text(outputs['html'], to_html(text, actions, probs, title))
  k = min(png_bytes, len(text))
  plot_heatmap(text[:k], actions[:, :k], probs[:, :k], outputs['png'], title)
  return {
      'paths': outputs,
      'offsets': offsets,
      'offsets_by_level': by_level,
      'actions': actions,
      'probs': probs,
      'text': text,
  }


def define_flags():
  """The command-line flags (defined only when this module is the entry point)."""
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir).')
  flags.DEFINE_string('file', None, 'Text file to segment (may also be given positionally).')
  flags.DEFINE_string('out', None, 'Output prefix (default DIR/segment/FILENAME).')
  flags.DEFINE_string('mode', 'greedy', 'Boundaries: greedy (p > 0.5) or sample.')
  flags.DEFINE_string('delimiter', '|', 'Written after each chunk in the .txt output.')
  flags.DEFINE_integer('seed', 0, 'Key for --mode=sample.', lower_bound=0)
  flags.DEFINE_integer('png_bytes', 1024, 'Bytes shown in the PNG heatmap.', lower_bound=1)
  flags.DEFINE_integer(
      'step',
      None,
      'Checkpoint step that must load (default: the latest step that loads).',
      lower_bound=0,
  )
  cli.positional('file')


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint or not f.file:
    raise UserError('usage: python -m tokjax.segment --checkpoint DIR FILE [--out PREFIX].')
  res = segment_file(
      f.checkpoint,
      f.file,
      f.out,
      mode=f.mode,
      delimiter=f.delimiter,
      seed=f.seed,
      png_bytes=f.png_bytes,
      step=f.step,
  )
  n, by_level = len(res['text']), res['offsets_by_level']
  count = (
      lambda offsets: f'{len(offsets)} chunks over {n} bytes ({n / max(len(offsets), 1):.2f} bytes'
  )
  if len(by_level) == 1:
    print(f'{count(by_level[0])} per chunk); first lines:')
  else:
    for s, offsets in enumerate(by_level):
      print(f'stage {s}: {count(offsets)} per chunk)')
    print(f'first lines ({tokenization.legend(len(by_level), f.delimiter)}):')
  print(
      tokenization.render(
          res['text'][:400], res['actions'][:, :400], f.delimiter, max_lines=6, terminal=True
      )
  )
  print('wrote', *res['paths'].values())


if __name__ == '__main__':
  define_flags()
  cli.run(main)
