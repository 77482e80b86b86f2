"""The ladder's out-of-domain sets share no text with the training split (`ladder.cross_shared`)."""

import pytest

from tokjax.errors import UserError
from tokjax.lab import common, ladder


def test_a_cross_set_cut_from_the_training_source_is_refused():
  config = common.compare_config('policy', 'stdlib', tiny=True)
  # stdlib_docs is extracted from the stdlib source: its docstrings are in stdlib's training split.
  with pytest.raises(UserError, match=r'--cross stdlib_docs: .* verbatim .*--allow_shared_cross'):
    ladder.cross_shared('stdlib', ['stdlib_docs'], config, allow=False)
  shares = ladder.cross_shared('stdlib', ['stdlib_docs', 'shakespeare'], config, allow=True)
  assert shares['stdlib_docs'] > 0.01
  assert shares['shakespeare'] <= 0.01


def test_shakespeare_is_scored_out_of_domain_on_code():
  config = common.compare_config('policy', 'shakespeare', tiny=True)
  shares = ladder.cross_shared('shakespeare', ['stdlib_docs', 'shakespeare'], config, allow=False)
  assert set(shares) == {'stdlib_docs'}  # The training corpus itself is never a cross set.
  assert shares['stdlib_docs'] <= 0.01
