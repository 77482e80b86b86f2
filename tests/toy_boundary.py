"""A toy boundary method in one file, as a user would add one (README, "Adding a boundary method").

Importing this module registers 'punctuation': a chunk ends at every byte listed in
config.boundary.punctuation.bytes. A method shipped with tokjax would live in
tokjax/models/rivals/punctuation.py instead, where the registry finds it without an import.
"""

import flax.linen as nn
import jax.numpy as jnp

from tokjax.errors import UserError
from tokjax.models import registry
from tokjax.models.rivals import common


class Punctuation(nn.Module):
  """tokens int32[B, L] -> `Boundaries`: a chunk ends at each byte in `ends`."""

  ends: str = '.,;\n'  # A str, as an exported config.json can carry it.
  capacity: int = 64

  def __call__(self, h, key, mode='sample', actions=None, tokens=None, early_logits=None, **unused):
    del h, key, early_logits, unused
    rule = jnp.isin(tokens, jnp.array(list(self.ends.encode()))).astype(jnp.float32)
    return common.finish(actions if mode == 'given' else rule, self.capacity)


def _validate(stage):
  if not stage.settings.bytes:
    raise UserError(f'{stage.where("settings.bytes")} is empty; give the bytes that end a chunk.')


registry.register(
    registry.BoundaryMethod(
        name='punctuation',
        build=lambda stage, config: Punctuation(ends=stage.settings.bytes, capacity=stage.capacity),
        defaults=dict(bytes='.,;\n'),  # config.boundary.punctuation.bytes
        description='a chunk ends at each punctuation byte (a toy)',
        validate=_validate,
    )
)
