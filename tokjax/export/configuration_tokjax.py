"""The transformers config of an exported tokjax byte LM (written into the export folder).

Self-contained: it imports transformers only, never jax or tokjax, so a folder written by
`python -m tokjax.export` loads wherever PyTorch and transformers are installed.

Fields (every one the forward in modeling_tokjax.py reads):
  kind: 'hierarchical' | 'flat'.
  vocab_size, bos_token_id, pad_token_id: the byte vocabulary (bytes 0..255, PAD 256, BOS 257).
  d_model, num_heads, byte_window, byte_mlp_ratio, main_mlp_ratio: widths and the byte layers'
    sliding window (0: full causal attention).
  encoder_layers, main_layers, decoder_layers: the hierarchical model's stacks.
  num_layers, mlp_ratio: the flat model's stack.
  stages: one dict per stage of boundaries, stage 0 first: 'method' (the boundary method), 'capacity'
    (its chunk buffer), the method's own settings ('target_rate', 'window', 'scale', ...), and for
    stage s >= 1 'encoder_layers', 'decoder_layers' and 'layer_window' (its chunk layers and their
    attention width in bytes).
  value_head: whether the model carries the critic of a value baseline.
  max_position_embeddings: the training sequence length (RoPE has no limit; tools read it as the
    context length).
  tokjax: the training config and provenance of the export (step, val bpb, the gate's result).

A config holds the fields of its kind only (byte_mlp_ratio, main_mlp_ratio, the three stacks, stages
and value_head for 'hierarchical'; num_layers and mlp_ratio for 'flat'); the other kind's, which
exports of earlier versions wrote as well, are read and dropped.
"""

from transformers import PretrainedConfig

# The fields only one kind of model reads.
KIND_FIELDS = {
    'hierarchical': (
        'encoder_layers',
        'main_layers',
        'decoder_layers',
        'byte_mlp_ratio',
        'main_mlp_ratio',
        'stages',
        'value_head',
    ),
    'flat': ('num_layers', 'mlp_ratio'),
}


class TokjaxConfig(PretrainedConfig):
  """See the module docstring."""

  model_type = 'tokjax'

  def __init__(
      self,
      kind='hierarchical',
      vocab_size=258,
      d_model=128,
      num_heads=4,
      encoder_layers=1,
      main_layers=2,
      decoder_layers=1,
      num_layers=4,
      byte_window=64,
      byte_mlp_ratio=1,
      main_mlp_ratio=4,
      mlp_ratio=4,
      stages=None,
      value_head=False,
      max_position_embeddings=256,
      tokjax=None,
      bos_token_id=257,
      pad_token_id=256,
      eos_token_id=None,
      **kwargs,
  ):
    if kind not in KIND_FIELDS:
      raise ValueError(f'kind must be one of {sorted(KIND_FIELDS)}, got {kind!r}.')
    self.kind = kind
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.hidden_size = d_model  # The name tools look for.
    self.num_heads = num_heads
    self.num_attention_heads = num_heads
    self.byte_window = byte_window
    kind_fields = dict(
        encoder_layers=encoder_layers,
        main_layers=main_layers,
        decoder_layers=decoder_layers,
        byte_mlp_ratio=byte_mlp_ratio,
        main_mlp_ratio=main_mlp_ratio,
        stages=list(stages or []),
        value_head=value_head,
        num_layers=num_layers,
        mlp_ratio=mlp_ratio,
    )
    # Only this kind's: config.json would otherwise describe a model the weights are not of.
    for name in KIND_FIELDS[kind]:
      setattr(self, name, kind_fields[name])
    self.max_position_embeddings = max_position_embeddings
    self.tokjax = tokjax or {}
    kwargs.setdefault('tie_word_embeddings', False)
    # transformers 5 declares only its dataclass fields to type checkers, but its __init__ accepts
    # and sets any keyword (`strict(accept_kwargs=True)`), as the token ids need.
    super().__init__(  # type: ignore[call-arg]
        bos_token_id=bos_token_id,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        **kwargs,
    )
