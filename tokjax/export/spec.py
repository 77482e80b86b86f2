"""A tokjax config read as the exported model's config.json fields (configuration_tokjax.py).

Every per-stage setting is read from the config's resolved levels (`tokjax.stages.resolve`, resolved
by the caller's entry point), each stage's entry through `stage_settings`.
"""

import dataclasses

from tokjax import models, stages
from tokjax.errors import UserError
from tokjax.models import registry
from tokjax.vocab import BOS_ID, PAD_ID, VOCAB_SIZE

# The methods the PyTorch port implements (modeling_tokjax.BOUNDARY_METHODS, which this module
# cannot import without torch).
EXPORTABLE = ('policy', 'hnet', 'gumbel', 'entropy', 'whitespace', 'stride')
# Why a registered method is not exported.
REFUSED = {
    'uniform': (
        "its boundaries are draws of JAX's random generator in every mode, greedy included, "
        'which PyTorch cannot reproduce'
    ),
    'bpe': 'the PyTorch port has no BPE tokenizer pass yet',
    'bpe_oracle': 'the PyTorch port has no BPE tokenizer pass yet',
}
# Fields of flax modules that are not settings.
_MODULE_FIELDS = ('parent', 'name')


def check_exportable(config, *, levels: stages.Levels) -> None:
  """UserError naming the first stage's method of config's model that cannot be exported; levels:
  config's (`stages.resolve`)."""
  for st in levels[: models.num_stages(config)]:
    method = st.method
    registry.get(method)  # An unregistered one: the registry's own line.
    if method not in EXPORTABLE:
      why = REFUSED.get(method, 'the PyTorch port does not implement it')
      where = st.where('method')
      raise UserError(
          f'{where}={method!r} cannot be exported: {why}; export a run of one of {EXPORTABLE}.'
      )


def stage_settings(config, st: stages.Stage) -> dict:
  """Stage st's entry of config.json 'stages' (st: one of config's levels): its method, capacity and
  the method's own settings (the fields of the module the registry builds for it), and for a level
  s >= 1 its chunk layers."""
  module = models.build_boundary(config, st)
  entry: dict[str, int | float | str | bool] = {'method': st.method}
  if dataclasses.is_dataclass(module):
    for f in dataclasses.fields(module):
      value = getattr(module, f.name)
      if f.name not in _MODULE_FIELDS and isinstance(value, (int, float, str, bool)):
        entry[f.name] = value
  entry['capacity'] = int(st.capacity)
  if st.level:
    entry.update(
        encoder_layers=int(st.encoder_layers),
        decoder_layers=int(st.decoder_layers),
        layer_window=int(st.window),
    )
  return entry


def hf_config(config, *, levels: stages.Levels) -> dict:
  """The TokjaxConfig fields of a tokjax config and its levels (`stages.resolve`; the model part;
  provenance is added by the exporter)."""
  m, first = config.model, levels[0]
  fields = dict(
      kind=m.kind,
      vocab_size=VOCAB_SIZE,
      bos_token_id=BOS_ID,
      pad_token_id=PAD_ID,
      d_model=int(m.d_model),
      num_heads=int(m.num_heads),
      byte_window=int(first.window),
      max_position_embeddings=int(config.data.seq_len),
  )
  if m.kind == 'flat':
    fields.update(num_layers=int(m.num_layers), mlp_ratio=int(m.mlp_ratio))
    return fields
  fields.update(
      encoder_layers=int(first.encoder_layers),
      main_layers=int(m.main_layers),
      decoder_layers=int(first.decoder_layers),
      byte_mlp_ratio=int(m.byte_mlp_ratio),
      main_mlp_ratio=int(m.main_mlp_ratio),
      stages=[stage_settings(config, st) for st in levels[: models.num_stages(config)]],
      value_head=bool(models.trains_critic(config, levels=levels)),
  )
  return fields
