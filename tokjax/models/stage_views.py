"""Stages as the model reads them: how many levels of boundaries, and the config each level sees.

Stage 0 draws chunk boundaries over bytes with config.boundary and config.model; stage s >= 1 draws
them over the chunks of stage s - 1 with entry s - 1 of each config.stages tuple (the fields are
declared in tokjax/config/defaults.py; tokjax/models/hierarchical.py builds the levels).
"""

import ml_collections

# The config.stages fields that describe a stage's model: one entry per stage above the bytes.
# (Its score-function fields are `estimator.STAGE_FIELDS`.)
STAGE_FIELDS = ('method', 'target_rate', 'capacity', 'encoder_layers', 'decoder_layers', 'window')


def stage_count(config) -> int:
  """S, the levels of boundaries."""
  return config.model.stages


def stage_method(config, s: int) -> str:
  """The boundary method of stage s: config.boundary.method at s = 0, config.stages.method[s - 1]
  above it."""
  return config.boundary.method if s == 0 else config.stages.method[s - 1]


def stage_config(config, s: int) -> ml_collections.ConfigDict:
  """The config as stage s's boundary method reads it: for s >= 1, config.boundary.method,
  config.boundary.target_rate and config.model.capacity replaced by config.stages' entry s - 1."""
  if s == 0:
    return config
  view = config.copy_and_resolve_references()
  with view.unlocked():
    view.boundary.method = stage_method(config, s)
    view.boundary.target_rate = float(config.stages.target_rate[s - 1])
    view.model.capacity = int(config.stages.capacity[s - 1])
  return view
