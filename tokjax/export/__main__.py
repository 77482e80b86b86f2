r"""Export a tokjax run to a transformers folder, or import one back (see `tokjax.export`).

  python -m tokjax.export --checkpoint RUN --out DIR [--step N]
  python -m tokjax.export --import DIR --out RUN

Bad input (a folder that is not a run or not an export, a missing step, a non-empty --out, a
boundary method that cannot be exported, a failed parity check) is one `error: ...` line, and
nothing is written.
"""

import os

from absl import flags

from tokjax import cli
from tokjax.errors import UserError


def define_flags():
  flags.DEFINE_string('checkpoint', None, 'Run folder of a training run (its workdir) to export.')
  flags.DEFINE_integer(
      'step', None, 'Checkpoint step to export (default: the latest).', lower_bound=0
  )
  flags.DEFINE_string(
      'import', None, 'An export folder to turn back into a tokjax run (written to --out).'
  )
  flags.DEFINE_string('out', None, 'The new folder to write (absent or empty).')


def main(argv):
  del argv
  f = flags.FLAGS
  source = f['import'].value
  if source and (f.checkpoint or f.step is not None):
    raise UserError(
        '--import reads an export folder and --checkpoint/--step a run: pass one or the other.'
    )
  if not f.checkpoint and not source:
    raise UserError(
        '--checkpoint is required: pass the run folder of a training run (or --import DIR to '
        'turn an export folder back into a run).'
    )
  if f.out is None:
    raise UserError('--out is required: the new folder to write.')
  if source:
    try:  # What the import reads the weights with, from the same extra as the export's.
      import safetensors.numpy  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    except ImportError as e:
      raise UserError(
          f"importing needs the optional extra ({e.name} is missing): pip install -e '.[export]'."
      ) from None
    from tokjax.export import importer  # pylint: disable=g-import-not-at-top

    done = importer.import_export(source, f.out)
    print(
        f'wrote {f.out}: the run at step {done["step"]} (fresh optimizer state); evaluate it with '
        f'`python -m tokjax.evaluate --checkpoint {f.out}`, train on with `python -m tokjax.train '
        f'--config {os.path.join(f.out, "config.py")} --resume --config.train.steps=N '
        '--extend_schedule`'
    )
    return
  from tokjax.export import exporter  # pylint: disable=g-import-not-at-top

  found = exporter.export(f.checkpoint, f.out, f.step)
  print(
      f'parity: largest |logit difference| {found["given"]:.2e} with given boundaries, '
      f'{found["greedy"]:.2e} with greedy ones, boundary probabilities within '
      f'{found["boundary_probs"]:.2e} (tolerance {exporter.TOLERANCE:g}); greedy boundaries agree'
  )
  print(f'wrote {f.out}')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
