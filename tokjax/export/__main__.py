r"""Export a tokjax run to a transformers folder (see `tokjax.export`).

  python -m tokjax.export --checkpoint RUN --out DIR [--step N]

Bad input (a folder that is not a run, a missing step, a non-empty --out, a boundary method that
cannot be exported, a failed parity check) is one `error: ...` line, and nothing is written.
"""

from absl import flags

from tokjax import cli
from tokjax.errors import UserError


def define_flags():
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir) to export.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to export (default: the latest).')
  flags.DEFINE_string('out', None, 'The new folder to write (absent or empty).')


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.checkpoint:
    raise UserError('--checkpoint is required: pass the run folder of a training run.')
  if not f.out:
    raise UserError('--out is required: the new folder to write.')
  from tokjax.export import exporter  # pylint: disable=g-import-not-at-top

  found = exporter.export(f.checkpoint, f.out, f.step)
  print(
      f'parity: largest |logit difference| {found["given"]:.2e} with given boundaries, '
      f'{found["greedy"]:.2e} with greedy ones (tolerance {exporter.TOLERANCE:g}); greedy '
      'boundaries agree'
  )
  print(f'wrote {f.out}')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
