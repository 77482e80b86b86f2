r"""lm-eval's own command line with the tokjax model registered:

  python -m tokjax.lm_eval.harness run --model tokjax --model_args checkpoint=RUN \
      --tasks arc_easy --batch_size 8

(`lm_eval --model tokjax` alone cannot find the model: lm-eval discovers only its own models.)
"""

import os
import sys


def main():
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top
  from tokjax.lm_eval import require_lm_eval  # pylint: disable=g-import-not-at-top

  try:
    require_lm_eval()
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  # lm-eval's bootstrap forks a process pool unless told not to; forking a JAX process can deadlock.
  os.environ.setdefault('DISABLE_MULTIPROC', '1')
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=g-import-not-at-top

  from tokjax.lm_eval import model  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401

  cli_evaluate()


if __name__ == '__main__':
  main()
