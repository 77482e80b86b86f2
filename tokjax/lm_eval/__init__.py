r"""Downstream tasks of EleutherAI's lm-evaluation-harness on tokjax checkpoints.

  python -m tokjax.lm_eval --checkpoint RUN --tasks arc_easy,piqa,hellaswag,lambada_openai
      [--limit N] [--boundaries greedy|sample] [--draws K] [--batch_size N] [--out FILE.json]
      [--include_path DIR]
  python -m tokjax.lm_eval.harness run --model tokjax --model_args checkpoint=RUN --tasks ...
      (lm-eval's own command line, with the tokjax model registered)

Modules: `scoring` (log-likelihood of bytes in windows, no lm-eval needed), `model` (the registered
lm-eval model `tokjax`), `tasks` (running tasks, the per-sample continuation bits-per-byte). All but
`scoring` need the optional extra: pip install -e '.[eval]'.
"""

EXTRA_HINT = "lm-eval is not installed; install the optional extra: pip install -e '.[eval]'."


def require_lm_eval() -> None:
  """Raises UserError with the install line when lm-eval cannot be imported."""
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  try:
    import lm_eval  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    raise UserError(EXTRA_HINT) from None
