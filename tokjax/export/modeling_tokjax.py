"""PyTorch port of tokjax's byte LMs, loaded by transformers from an exported folder.

  model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
  out = model(input_ids)                       # greedy boundaries
  out = model(input_ids, do_sample=True, generator=torch.Generator().manual_seed(0))
  out = model(input_ids, boundaries=out.boundaries)   # given boundaries, one tensor per stage
  ids = model.generate(input_ids, max_new_tokens=64)  # boundaries decided on the fly, cached

Self-contained: it imports torch and transformers only, never jax or tokjax. It computes what
tokjax/models computes (the exporter checks that the logits agree within 1e-4 before it writes):
Gemma-2 blocks (RMSNorm with a (1 + scale) gain before and after each sublayer, RoPE at explicit
positions on split halves, tanh-GeLU GeGLU), byte layers with sliding-window causal attention, and
the hierarchical model's stages: boundaries a_t = 1 where position t ends its chunk (the first and
last position forced, boundaries past the chunk capacity dropped), select-downsampling of each
chunk's last state into a buffer of static capacity, the chunk layers at the byte positions where
chunks end, and distribute-add upsampling of the latest chunk complete at each position.

Input ids are bytes 0..255, PAD 256, BOS 257 (training rows start with BOS). The model is causal in
bytes, boundary decisions included, except for the convention's forced boundary at a row's last
position; a row shorter than the training length leaves that one to a spare position (`forward`),
so right padding leaves every real position's logits unchanged.

Shape names: B rows, L bytes, N_s the input positions of stage s, C a chunk capacity, D width,
H heads, K head width, V vocabulary.
"""

import dataclasses
import functools
import inspect
from typing import Optional, cast

import torch
from torch import nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_tokjax import TokjaxConfig

PAD_ID = 256
BOS_ID = 257
_NEG_INF = -1e9  # Finite, as in tokjax: a fully masked row gives a uniform softmax.
SOFTCAP = 6.0  # The scaled policy's logits are SOFTCAP * tanh(z / SOFTCAP).


def gelu(x):
  return F.gelu(x, approximate='tanh')  # jax.nn.gelu's default.


class RMSNorm(nn.Module):
  """x / rms(x) * (1 + scale), computed in float32."""

  def __init__(self, d: int, eps: float = 1e-6):
    super().__init__()
    self.scale = nn.Parameter(torch.zeros(d))
    self.eps = eps

  def forward(self, x):
    return F.rms_norm(x.float(), (x.shape[-1],), 1.0 + self.scale, self.eps)


@functools.lru_cache
def _inverse_wavelengths(half: int, max_wavelength: float, device) -> torch.Tensor:
  with torch.inference_mode(False):  # Kept for every later call, with or without gradients.
    return max_wavelength ** (-torch.arange(half, dtype=torch.float32, device=device) / half)


def rope_tables(positions, head_dim: int, max_wavelength: float = 10_000.0):
  """(cos, sin): float32[B, L, 1, K] for `apply_rope` at positions int[B, L], sin signed for the
  swapped halves."""
  freq = _inverse_wavelengths(head_dim // 2, max_wavelength, positions.device)
  angle = positions[..., None, None].float() * freq
  sin, cos = torch.sin(angle), torch.cos(angle)
  return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x, rope):
  """Rotates x: [B, L, H, K] by `rope_tables` (split halves, not pairs): [x1 cos - x2 sin,
  x2 cos + x1 sin], with tokjax's arithmetic (x2 (-sin) is -(x2 sin) exactly)."""
  cos, sin = rope
  half = x.shape[-1] // 2
  return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin


def attention_bias(q_pos, k_pos, key_valid=None, window: int = 0):
  """float32[B, 1, Q, S]: 0 where a query sees a key (positions <= its own, within `window` when
  > 0, key_valid where given), _NEG_INF elsewhere; added to the scores, as tokjax masks them."""
  mask = k_pos[:, None, :] <= q_pos[:, :, None]
  if window > 0:
    mask = mask & ((q_pos[:, :, None] - k_pos[:, None, :]) < window)
  if key_valid is not None:
    mask = mask & key_valid[:, None, :]
  return torch.where(mask, 0.0, _NEG_INF)[:, None]


class KeyPositions:
  """The positions and validity of a stack's cached keys (decoding), which all its layers share.

  window > 0 keeps the last `window` positions only: a byte stack's cache, which holds every
  position, so the keys its sliding window can reach are exactly the last `window`.
  """

  def __init__(self, window: int = 0):
    self.window = window
    # None until the first extend; validity stays None while every key is valid (byte stacks).
    self.pos: torch.Tensor | None = None
    self.valid: torch.Tensor | None = None

  def append(self, kept, new):
    """-> (kept then new along positions: what the new queries may reach, what the cache keeps)."""
    every = new if kept is None else torch.cat([kept, new], 1)
    return every, every[:, -self.window :] if self.window > 0 else every

  def extend(self, positions, key_valid=None):
    """Appends positions int[B, L], valid where key_valid: bool[B, L] (a stack gives it on every
    call or on none: None, every key valid) -> every position and validity the new queries may
    reach, those the window drops too."""
    if self.pos is not None and (key_valid is None) != (self.valid is None):
      raise ValueError('a stack cache takes key validity on every call or on none.')
    positions, self.pos = self.append(self.pos, positions)
    if key_valid is not None:
      key_valid, self.valid = self.append(self.valid, key_valid)
    return positions, key_valid


class StackCache:
  """One stack's keys and values of earlier positions (decoding): a pair per layer, at the
  `KeyPositions` its layers read, which stacks over the same positions share (the byte stacks)."""

  def __init__(self, num_layers: int, positions: KeyPositions):
    self.positions = positions
    # None until the first extend.
    self.k: list[torch.Tensor | None] = [None] * num_layers
    self.v: list[torch.Tensor | None] = [None] * num_layers

  def extend(self, layer: int, k, v):
    """Appends layer `layer`'s keys and values [B, L, H, K] at the positions last appended."""
    k, self.k[layer] = self.positions.append(self.k[layer], k)
    v, self.v[layer] = self.positions.append(self.v[layer], v)
    return k, v


class Attention(nn.Module):
  """Multi-head causal self-attention with RoPE over explicit positions."""

  def __init__(self, d: int, num_heads: int):
    super().__init__()
    self.num_heads, self.head_dim = num_heads, d // num_heads
    self.q_proj = nn.Linear(d, d, bias=False)
    self.k_proj = nn.Linear(d, d, bias=False)
    self.v_proj = nn.Linear(d, d, bias=False)
    self.o_proj = nn.Linear(d, d, bias=False)

  def forward(self, x, rope, bias, cache=None, layer: int = 0):
    """x: [B, L, D], rope: `rope_tables` of its positions, bias: `attention_bias` of its keys ->
    [B, L, D]. cache: a `StackCache` whose keys come before x's (decoding); x's keys are added to
    it as layer `layer`'s."""
    b, l, _ = x.shape
    split = lambda t: t.view(b, l, self.num_heads, self.head_dim)
    q = apply_rope(split(self.q_proj(x)), rope)
    k = apply_rope(split(self.k_proj(x)), rope)
    v = split(self.v_proj(x))
    if cache is not None:
      k, v = cache.extend(layer, k, v)
    heads = lambda t: t.transpose(1, 2)  # [B, H, ., K], as the fused attention takes them.
    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=bias)
    return self.o_proj(heads(out).reshape(b, l, -1))


class GeGLU(nn.Module):

  def __init__(self, d: int, hidden: int):
    super().__init__()
    self.gate_proj = nn.Linear(d, hidden, bias=False)
    self.up_proj = nn.Linear(d, hidden, bias=False)
    self.down_proj = nn.Linear(hidden, d, bias=False)

  def forward(self, x):
    return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
  """Gemma-2 block: x + post_norm(attn(pre_norm(x))), then x + post_norm(mlp(pre_norm(x)))."""

  def __init__(self, d: int, num_heads: int, mlp_hidden: int):
    super().__init__()
    self.pre_attn_norm, self.post_attn_norm = RMSNorm(d), RMSNorm(d)
    self.pre_mlp_norm, self.post_mlp_norm = RMSNorm(d), RMSNorm(d)
    self.attn = Attention(d, num_heads)
    self.mlp = GeGLU(d, mlp_hidden)

  def forward(self, x, rope, bias, cache=None, layer: int = 0):
    x = x + self.post_attn_norm(self.attn(self.pre_attn_norm(x), rope, bias, cache, layer))
    return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))


class Stack(nn.Module):
  """Blocks over explicit positions; sliding-window attention when `window` > 0."""

  def __init__(self, num_layers: int, d: int, num_heads: int, mlp_hidden: int, window: int):
    super().__init__()
    self.head_dim, self.window = d // num_heads, window
    self.blocks = nn.ModuleList(Block(d, num_heads, mlp_hidden) for _ in range(num_layers))

  def frame(self, positions, key_valid=None, cache=None):
    """(rope, bias): what every layer reads at positions int[B, L] besides its own keys, the
    rotation of its queries and keys and the attention bias over the keys it sees (key_valid:
    bool[B, L] or None). cache: the stack's `StackCache`, whose positions these extend."""
    k_pos, valid = positions, key_valid
    if cache is not None:
      k_pos, valid = cache.positions.extend(positions, key_valid)
    rope = rope_tables(positions, self.head_dim)
    return rope, attention_bias(positions, k_pos, valid, self.window)

  def forward(self, x, positions, key_valid=None, cache=None, frame=None):
    """x: [B, L, D], positions: int[B, L], key_valid: bool[B, L] or None -> [B, L, D].

    cache: the stack's `StackCache` (decoding), which x's positions and keys extend. frame: this
    call's `frame`, made by a stack over the same positions whose cache shares these positions (the
    byte stacks), which extended them already.
    """
    rope, bias = self.frame(positions, key_valid, cache) if frame is None else frame
    for i, block in enumerate(self.blocks):
      x = block(x, rope, bias, cache, i)
    return x


class LMHead(nn.Module):
  """Final RMSNorm and an untied projection to next-byte logits (float32)."""

  def __init__(self, d: int, vocab_size: int):
    super().__init__()
    self.norm = RMSNorm(d)
    self.proj = nn.Linear(d, vocab_size, bias=False)

  def forward(self, x):
    return self.proj(self.norm(x))


# ------------------------------------------------------------------------------------ boundaries


def chunk_index(actions):
  """int64[B, L]: cumsum(a) - 1, the latest chunk complete at each position."""
  return torch.cumsum((actions > 0.5).long(), dim=-1) - 1


def forced_mask(shape, device):
  t = torch.arange(shape[-1], device=device)
  return ((t == 0) | (t == shape[-1] - 1)).expand(shape)


def enforce_convention(sampled, capacity: int):
  """Raw decisions {0,1}[B, L] -> executed float32[B, L]: first and last position forced, and
  boundaries dropped once capacity - 1 chunks are closed before the last position."""
  forced = forced_mask(sampled.shape, sampled.device)
  s = torch.where(forced, 0.0, sampled.float())
  room = (torch.cumsum(s, dim=-1) - s) < capacity - 2
  return torch.where(forced, 1.0, s * room)


@dataclasses.dataclass
class Boundaries:
  """A stage's executed boundaries float32[B, N] and what the model reads besides them."""

  actions: torch.Tensor
  logits: torch.Tensor
  gate: Optional[torch.Tensor] = None  # Multiplier of the upsampled chunk output (forward ~1).
  ema: Optional[torch.Tensor] = None  # H-Net's smoothing probabilities.


def ste_gate(executed, probs):
  """The forward value of tokjax's straight-through factor c + stopgrad(1 - c) (1 up to rounding)."""
  c = torch.where(executed > 0.5, probs, 1.0 - probs)
  return c + (1.0 - c)


def restrict_to_valid(bnd: Boundaries, valid) -> Boundaries:
  """Boundaries over a padded sequence (an inner stage's chunks): the last valid position forced,
  none on padding."""
  n = valid.sum(-1, keepdim=True)
  last = torch.arange(valid.shape[-1], device=valid.device) == n - 1
  actions = torch.where(last, 1.0, torch.where(valid, bnd.actions, 0.0))
  gate = bnd.gate
  if gate is not None:
    flipped = (actions > 0.5) != (bnd.actions > 0.5)
    gate = torch.where(flipped, 2.0 - gate, gate)
  return dataclasses.replace(bnd, actions=actions, gate=gate)


def _uniform(shape, generator, device):
  return torch.rand(shape, generator=generator, device=device)


class Policy(nn.Module):
  """The learned boundary policy (tokjax 'policy'): independent (window 1) or sequential."""

  def __init__(
      self,
      d: int,
      capacity: int,
      target_rate: float = 0.2,
      window: int = 1,
      scale: float = 1 / 16,
      form: str = 'auto',
  ):
    super().__init__()
    del target_rate  # Training's: the bias it set is a weight here.
    self.capacity, self.window, self.scale = capacity, window, scale
    # 'plain': logit = x + bias; 'scaled': 6 tanh((s x + bias) / 6); 'auto': scaled for w > 1.
    self.scaled = window > 1 if form == 'auto' else form == 'scaled'
    self.proj = nn.Linear(d, window, bias=False)
    self.bias = nn.Parameter(torch.zeros(()))

  def _form(self, x):
    if not self.scaled:
      return x + self.bias
    return SOFTCAP * torch.tanh((self.scale * x + self.bias) / SOFTCAP)

  def _logits(self, v, executed):
    w = self.window
    x = v[..., w - 1]
    for k in range(1, w):
      shifted = F.pad(executed, (k, 0))[:, : executed.shape[1]]
      x = x + v[..., w - 1 - k] * shifted
    return self._form(x)

  def step_logit(self, h, history):
    """The logit at one position from its state h: [B, D] and the executed decisions of the w - 1
    positions before it, history: float32[B, w - 1] (the latest last)."""
    v = self.proj(h.float())
    w = self.window
    return self._form(v[:, w - 1] + (v[:, : w - 1] * history).sum(-1))

  def _sequential(self, v, uniforms, capacity):
    """Draws one position at a time, each given the previous w - 1 executed decisions."""
    b, l, w = v.shape
    history = torch.zeros(b, w - 1, device=v.device)
    count = torch.zeros(b, device=v.device)
    samples = []
    for t in range(l):
      v_t = v[:, t]
      p = torch.sigmoid(self._form(v_t[:, w - 1] + (v_t[:, : w - 1].flip(-1) * history).sum(-1)))
      sample = (uniforms[:, t] < p).float()
      forced = t == 0 or t == l - 1
      executed = torch.ones_like(sample) if forced else sample * (count < capacity - 2)
      if not forced:
        count = count + executed
      history = torch.cat([executed[:, None], history[:, :-1]], dim=1)
      samples.append(sample)
    return torch.stack(samples, dim=1)

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    del tokens, early_logits
    capacity = capacity or self.capacity
    v = self.proj(h.float())
    if mode == 'given':
      sampled = actions
    elif self.window == 1:
      logits0 = self._form(v[..., 0])
      if mode == 'greedy':
        sampled = (logits0 > 0).float()
      else:
        sampled = (_uniform(logits0.shape, generator, h.device) < torch.sigmoid(logits0)).float()
    else:
      shape = h.shape[:2]
      u = torch.full(shape, 0.5, device=h.device) if mode == 'greedy' else None
      uniforms = _uniform(shape, generator, h.device) if u is None else u
      sampled = self._sequential(v, uniforms, capacity)
    executed = enforce_convention(sampled, capacity)
    return Boundaries(executed, self._logits(v, executed))


class HNetRouter(nn.Module):
  """H-Net dynamic chunking (tokjax 'hnet'): p_t = (1 - cos(W_q h_t, W_k h_{t-1})) / 2."""

  def __init__(self, d: int, capacity: int, target_rate: float = 0.2, ratio_weight: float = 0.03):
    super().__init__()
    del target_rate, ratio_weight  # Training's ratio loss.
    self.capacity = capacity
    self.q = nn.Linear(d, d, bias=False)
    self.k = nn.Linear(d, d, bias=False)

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    h = h.float()
    q, k = self.q(h), self.k(h)
    k_prev = F.pad(k, (0, 0, 1, 0))[:, :-1]
    cos = (q * k_prev).sum(-1) * torch.rsqrt((q * q).sum(-1) * (k_prev * k_prev).sum(-1) + 1e-8)
    p = torch.clamp((1.0 - cos) / 2.0, 0.0, 1.0)
    p = torch.cat([torch.ones_like(p[:, :1]), p[:, 1:]], dim=1)
    sampled = actions if mode == 'given' else (p >= 0.5).float()
    executed = enforce_convention(sampled, capacity or self.capacity)
    logits = torch.log(p.clamp(1e-6, 1.0)) - torch.log((1.0 - p).clamp(1e-6, 1.0))
    return Boundaries(executed, logits, gate=ste_gate(executed, p), ema=p)


class GumbelPooling(nn.Module):
  """Dynamic token pooling (tokjax 'gumbel'): a Gumbel-sigmoid over an MLP's logit."""

  def __init__(
      self,
      d: int,
      capacity: int,
      target_rate: float = 0.2,
      temperature: float = 1.0,
      prior_weight: float = 1.0,
  ):
    super().__init__()
    del target_rate, prior_weight  # Training's binomial prior (its bias init is a weight here).
    self.capacity, self.temperature = capacity, temperature
    self.mlp_in = nn.Linear(d, d)
    self.mlp_out = nn.Linear(d, 1)

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    logits = self.mlp_out(gelu(self.mlp_in(h.float())))[..., 0]
    if mode == 'sample':
      u = _uniform(logits.shape, generator, h.device).clamp(1e-6, 1.0 - 1e-6)
      soft = torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.temperature)
    else:
      soft = torch.sigmoid(logits / self.temperature)
    sampled = actions if mode == 'given' else (soft > 0.5).float()
    executed = enforce_convention(sampled, capacity or self.capacity)
    return Boundaries(executed, logits, gate=ste_gate(executed, soft))


class EntropySpikes(nn.Module):
  """BLT's entropy spikes (tokjax 'entropy'): a boundary where the early head's entropy exceeds a
  learned threshold."""

  THRESHOLD_SCALE = 30.0

  def __init__(self, d: int, capacity: int, target_rate: float = 0.2):
    super().__init__()
    del d, target_rate  # Training's controller of the threshold, a weight here.
    self.capacity = capacity
    self.threshold = nn.Parameter(torch.zeros(()))

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    logp = torch.log_softmax(early_logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    theta = self.THRESHOLD_SCALE * self.threshold
    sampled = actions if mode == 'given' else (ent > theta).float()
    return Boundaries(enforce_convention(sampled, capacity or self.capacity), ent - theta)


def _spacelike(t):
  digit_or_letter = ((t >= 48) & (t <= 57)) | ((t >= 65) & (t <= 90)) | ((t >= 97) & (t <= 122))
  continuation = (t >= 0x80) & (t <= 0xBF)
  return ((t < 256) & ~digit_or_letter & ~continuation) | (t == BOS_ID)


class Whitespace(nn.Module):
  """SpaceByte's rule (tokjax 'whitespace'): a chunk ends at the first spacelike byte of a run."""

  def __init__(self, d: int, capacity: int):
    super().__init__()
    del d
    self.capacity = capacity

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    s = _spacelike(tokens)
    prev = F.pad(s, (1, 0))[:, :-1]
    sampled = actions if mode == 'given' else (s & ~prev).float()
    executed = enforce_convention(sampled, capacity or self.capacity)
    return Boundaries(executed, torch.zeros_like(executed))


class Stride(nn.Module):
  """A chunk every round(1 / target_rate) positions (tokjax 'stride')."""

  def __init__(self, d: int, capacity: int, target_rate: float = 0.2):
    super().__init__()
    del d
    self.capacity, self.every = capacity, max(1, round(1.0 / target_rate))

  def forward(
      self, h, mode, actions=None, tokens=None, early_logits=None, generator=None, capacity=None
  ):
    rule = ((torch.arange(h.shape[1], device=h.device) + 1) % self.every == 0).float()
    sampled = actions if mode == 'given' else rule.expand(h.shape[:2])
    executed = enforce_convention(sampled, capacity or self.capacity)
    return Boundaries(executed, torch.zeros_like(executed))


BOUNDARY_METHODS = {
    'policy': Policy,
    'hnet': HNetRouter,
    'gumbel': GumbelPooling,
    'entropy': EntropySpikes,
    'whitespace': Whitespace,
    'stride': Stride,
}


def build_boundary(stage: dict, d: int) -> nn.Module:
  """The boundary method of a config.json stage entry: its method and every setting of it, each one
  a parameter of the method's constructor here (a setting this file does not know is an error, not
  silently dropped)."""
  method = BOUNDARY_METHODS[stage['method']]
  settings = {k: v for k, v in stage.items() if k != 'method'}
  # The signature of the class is its __init__'s without self.
  known = set(inspect.signature(method).parameters) - {'self', 'd'}
  unknown = sorted(set(settings) - known)
  if unknown:
    raise ValueError(
        f"config.json gives the {stage['method']!r} boundary method the settings {unknown}, which "
        f'this modeling_tokjax.py ({method.__name__}) does not take: export the run again with '
        'the tokjax that trained it.'
    )
  return method(d, **settings)


# ----------------------------------------------------------------------------- chunks and stages


def downsample(x, actions, capacity: int):
  """x: [B, N, D], actions {0,1}[B, N] -> (chunks [B, C, D], ends int64[B, C] (N on empty
  slots), valid bool[B, C]): the state at each chunk's last position; chunks past C are dropped."""
  b, n = actions.shape
  is_end = actions > 0.5
  index = chunk_index(actions)
  slot = torch.where(is_end & (index < capacity), index, capacity)
  ends = torch.full((b, capacity + 1), n, dtype=torch.long, device=x.device)
  ends.scatter_(1, slot, torch.arange(n, device=x.device).expand(b, n))
  ends = ends[:, :capacity]
  valid = ends < n
  chunks = torch.gather(x, 1, ends.clamp(max=n - 1)[..., None].expand(-1, -1, x.shape[-1]))
  return chunks * valid[..., None].to(x.dtype), ends, valid


def upsample(x, chunk_out, actions, gate=None):
  """y_t = x_t + gate_t * Y[j(t)], Y[j(t)] the latest chunk ending at or before t."""
  j = chunk_index(actions).clamp(0, chunk_out.shape[1] - 1)
  y = torch.gather(chunk_out, 1, j[..., None].expand(-1, -1, chunk_out.shape[-1]))
  if gate is not None:
    y = y * gate[..., None]
  return x + y


def ema_chunks(chunk_out, probs, ends):
  """H-Net smoothing zbar_j = P_j z_j + (1 - P_j) zbar_{j-1}, P_j = probs at chunk j's end."""
  n = probs.shape[1]
  p = torch.gather(probs, 1, ends.clamp(max=n - 1))
  p = torch.where(ends < n, p, 1.0)[..., None]
  out, prev = [], torch.zeros_like(chunk_out[:, 0])
  for j in range(chunk_out.shape[1]):
    prev = p[:, j] * chunk_out[:, j] + (1.0 - p[:, j]) * prev
    out.append(prev)
  return torch.stack(out, dim=1)


def _greedy_with_spare(method, x, tokens, early_logits) -> Boundaries:
  """A boundary method's greedy decisions over a stage's N positions so far (x: [B, N, D], tokens:
  int[B, N], early_logits: [B, N, V] or None) and one spare position after them, which takes the
  convention's forced last boundary, so the last real decision is the method's; no capacity limit.
  -> `Boundaries` over N + 1 positions."""
  return method(
      F.pad(x, (0, 0, 0, 1)),
      'greedy',
      tokens=F.pad(tokens, (0, 1), value=PAD_ID),
      early_logits=None if early_logits is None else F.pad(early_logits, (0, 0, 0, 1)),
      capacity=x.shape[1] + 1,
  )


def _put(buf, index, value, live, fill):
  """buf: [B, N, ...] (None: empty) with value: [B, ...] at index[b] in each live row (bool[B]),
  grown by slots of `fill` where a row needs one more."""
  b = value.shape[0]
  if buf is None:
    buf = value.new_full((b, 0, *value.shape[1:]), fill)
  need = int(index[live].max()) + 1 if bool(live.any()) else 0
  if need > buf.shape[1]:
    buf = torch.cat([buf, buf.new_full((b, need - buf.shape[1], *buf.shape[2:]), fill)], 1)
  rows = torch.nonzero(live)[:, 0]
  buf = buf.clone()
  buf[rows, index[rows]] = value[rows]
  return buf


@dataclasses.dataclass
class TokjaxCausalLMOutput(CausalLMOutput):
  """CausalLMOutput with the boundaries of every stage.

  boundaries: one float32[B, N_s] per stage, stage 0's over bytes (what `boundaries=` takes back).
  boundary_logits: one float32[B, N_s] per stage, its method's logits (zeros for a fixed rule).
  byte_boundaries: float32[B, S, L], every stage's chunk ends marked on bytes.
  early_logits: float32[B, L, V], stage 0's early-exit logits.
  values: float32[B, L], the critic's predicted returns (a model with a value head).
  cache: the `TokjaxCache` after a cached forward (use_cache=True), to pass back with the next bytes.
  """

  boundaries: Optional[tuple] = None
  boundary_logits: Optional[tuple] = None
  byte_boundaries: Optional[torch.Tensor] = None
  early_logits: Optional[torch.Tensor] = None
  # A ModelOutput is an OrderedDict, whose values() this field shadows; the field name is kept, as
  # callers of exported models read the critic's returns by it.
  values: Optional[torch.Tensor] = None  # type: ignore[assignment]
  cache: Optional[object] = None


class Critic(nn.Module):

  def __init__(self, d: int):
    super().__init__()
    self.hidden = nn.Linear(d, d)
    self.out = nn.Linear(d, 1)

  def forward(self, h):
    return self.out(gelu(self.hidden(h.float())))[..., 0]


class TokjaxPreTrainedModel(PreTrainedModel):
  config_class = TokjaxConfig
  base_model_prefix = 'tokjax'
  main_input_name = 'input_ids'
  _no_split_modules = ['Block']

  def _init_weights(self, module):
    # Every parameter comes from the export (from_pretrained refuses a folder that lacks one), so
    # nothing is drawn here.
    del module

  @classmethod
  def from_pretrained(cls, *args, **kwargs):
    """transformers' from_pretrained, refusing a checkpoint with missing or unexpected weights or
    a weight of another shape (never a silent random init), whatever `ignore_mismatched_sizes`
    says."""
    want_info = kwargs.pop('output_loading_info', False)
    # Asked to ignore them, transformers leaves a mismatched tensor uninitialised; not asked, it
    # raises without naming it. Ignored here so that the error below names each one.
    kwargs['ignore_mismatched_sizes'] = True
    # transformers annotates from_pretrained as returning the model, but with output_loading_info
    # it returns (model, loading info).
    model, info = cast(
        tuple[PreTrainedModel, dict],
        super().from_pretrained(*args, output_loading_info=True, **kwargs),
    )
    mismatched = sorted(info.get('mismatched_keys') or ())
    if mismatched:
      shapes = '; '.join(
          f'{name} has shape {tuple(got)} in the checkpoint and {tuple(want)} in the model'
          for name, got, want in mismatched
      )
      raise ValueError(
          f'the checkpoint does not fit the tokjax model: {shapes} (config.json does not describe '
          'these weights; export the run again).'
      )
    bad = {k: sorted(v) for k, v in info.items() if k in ('missing_keys', 'unexpected_keys') and v}
    if bad:
      raise ValueError(f'the checkpoint does not fit the tokjax model: {bad}')
    return (model, info) if want_info else model


class TokjaxForCausalLM(TokjaxPreTrainedModel, GenerationMixin):
  """tokjax's hierarchical byte LM (S stages of boundaries) or its flat Transformer."""

  def __init__(self, config: TokjaxConfig):
    super().__init__(config)
    c = config
    d, h = c.d_model, c.num_heads
    self.embed = nn.Embedding(c.vocab_size, d)
    if c.kind == 'flat':
      self.layers = Stack(c.num_layers, d, h, c.mlp_ratio * d, c.byte_window)
      self.head = LMHead(d, c.vocab_size)
    else:
      byte_mlp, chunk_mlp = c.byte_mlp_ratio * d, c.main_mlp_ratio * d
      self.encoder = Stack(c.encoder_layers, d, h, byte_mlp, c.byte_window)
      self.main = Stack(c.main_layers, d, h, chunk_mlp, 0)
      self.decoder = Stack(c.decoder_layers, d, h, byte_mlp, c.byte_window)
      self.early_head = LMHead(d, c.vocab_size)
      self.head = LMHead(d, c.vocab_size)
      self.boundary = build_boundary(c.stages[0], d)
      inner = c.stages[1:]
      self.inner_boundaries = nn.ModuleList(build_boundary(self._method(st), d) for st in inner)
      self.inner_encoders = nn.ModuleList(
          Stack(st['encoder_layers'], d, h, chunk_mlp, st['layer_window']) for st in inner
      )
      self.inner_decoders = nn.ModuleList(
          Stack(st['decoder_layers'], d, h, chunk_mlp, st['layer_window']) for st in inner
      )
      self.inner_early_heads = nn.ModuleList(LMHead(d, c.vocab_size) for _ in inner)
      if c.value_head:
        self.critic = Critic(d)
    self.post_init()

  @staticmethod
  def _method(stage: dict) -> dict:
    """A stage's boundary-method settings (its layer settings removed)."""
    return {
        k: v
        for k, v in stage.items()
        if k not in ('encoder_layers', 'decoder_layers', 'layer_window')
    }

  @property
  def num_stages(self) -> int:
    return 0 if self.config.kind == 'flat' else len(self.config.stages)

  def get_input_embeddings(self):
    return self.embed

  def forward(
      self,
      input_ids,
      attention_mask=None,
      boundaries=None,
      do_sample: bool = False,
      generator=None,
      labels=None,
      return_dict=None,
      generation: bool = False,
      cache=None,
      use_cache: bool = False,
      **unused,
  ):
    """input_ids: int[B, L] -> TokjaxCausalLMOutput (logits float32[B, L, V]).

    boundaries: given boundaries, float[B, L] for stage 0 or a tuple with one per stage (None for a
    stage that decides its own); the other stages draw theirs (do_sample=True, with `generator`:
    a torch.Generator) or take the greedy ones (the default). attention_mask: only right padding
    is supported (the model is causal: padding after a row leaves its logits unchanged).
    labels: int[B, L] of the same bytes; the loss is the mean next-byte cross-entropy (-100 ignored).

    generation=True reads rows as tokjax's generation does (`generate` passes it): open-ended at any
    length, greedy boundaries, and no chunk capacity (every chunk is kept). With use_cache=True (or a
    `cache` from an earlier call) the model reads the new bytes through key/value caches
    (`TokjaxCache`, in out.cache: a prompt in one pass, later bytes one at a time) and returns the
    same logits.
    """
    del return_dict, unused
    # Before any path, cached or not: a PAD before a row's bytes would be read as text.
    if attention_mask is not None and not bool(attention_mask.bool().all()):
      am = attention_mask.bool()
      if bool((am[:, 1:] & ~am[:, :-1]).any()):
        raise ValueError(
            'tokjax models take right padding only (a PAD before a byte would be read as text): '
            'generate from rows of one length, or one row at a time (lm-eval: --batch_size 1).'
        )
    if use_cache or cache is not None:
      if boundaries is not None or do_sample or labels is not None:
        raise ValueError('the cached forward takes greedy boundaries only, and no labels.')
      cache = TokjaxCache(self) if cache is None else cache
      # A cache made without gradients (generate's case) is read and written in inference mode,
      # which skips autograd's bookkeeping on every op: at one byte per call, with small
      # matrices, that bookkeeping is a large part of the time. Inference tensors cannot be
      # changed in place outside that mode, so the caller gets a copy of the logits.
      with torch.inference_mode(cache.inference):
        logits = self._cached(input_ids.long(), cache)
      return TokjaxCausalLMOutput(logits=logits.clone() if cache.inference else logits, cache=cache)
    tokens = input_ids.long()
    if self.config.kind == 'flat':
      positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
      out = TokjaxCausalLMOutput(logits=self.head(self.layers(self.embed(tokens), positions)))
    else:
      mode = 'sample' if do_sample else 'greedy'
      l = tokens.shape[1]
      if boundaries is None and (generation or l < self.config.max_position_embeddings):
        # A row shorter than training's is open-ended (a prompt, a scored text): one spare PAD
        # position takes the convention's forced last boundary, which would otherwise override
        # the decision at the row's last byte (as tokjax's generation and lm-eval rows do).
        spare = F.pad(tokens, (0, 1), value=PAD_ID)
        out = self._hierarchical(spare, None, mode, generator, l + 1 if generation else None)
        out.logits, out.early_logits = out.logits[:, :l], out.early_logits[:, :l]
        out.byte_boundaries = out.byte_boundaries[..., :l]
        out.boundaries = (out.boundaries[0][:, :l],) + out.boundaries[1:]
        if out.values is not None:
          out.values = out.values[:, :l]
      else:
        out = self._hierarchical(tokens, boundaries, mode, generator)
    if labels is not None:
      assert out.logits is not None  # Both model kinds always give logits.
      out.loss = F.cross_entropy(
          out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
          labels[:, 1:].reshape(-1).long(),
          ignore_index=-100,
      )
    return out

  def _hierarchical(self, tokens, given, mode, generator, capacity=None):
    """capacity: every stage's chunk buffer instead of the configured ones (generation). A row
    longer than training's (max_position_embeddings) gets each configured buffer grown in
    proportion, as tokjax's `HierarchicalByteLM.for_length` does."""
    s_count = self.num_stages
    given = tuple(given) if isinstance(given, (tuple, list)) else (given,) + (None,) * (s_count - 1)
    given = given + (None,) * (s_count - len(given))
    methods = [self.boundary, *self.inner_boundaries]
    b, l = tokens.shape
    train = self.config.max_position_embeddings
    grown = lambda c: c if l <= train else -(-c * l // train)
    capacities = [capacity or grown(st['capacity']) for st in self.config.stages]
    positions = torch.arange(l, device=tokens.device).expand(b, l)
    h = self.encoder(self.embed(tokens), positions)
    early_logits = self.early_head(h)
    x, valid, stage_tokens = h, None, tokens
    levels = []
    for s in range(s_count):
      bnd = methods[s](
          x,
          'given' if given[s] is not None else mode,
          actions=None if given[s] is None else given[s].float(),
          tokens=stage_tokens,
          early_logits=early_logits if s == 0 else None,
          generator=generator,
          capacity=capacities[s],
      )
      if s > 0:
        bnd = restrict_to_valid(bnd, valid)
      chunks, index, chunk_valid = downsample(x, bnd.actions, capacities[s])
      at = index.clamp(max=x.shape[1] - 1)
      levels.append(dict(x=x, positions=positions, valid=valid, boundaries=bnd, index=index))
      positions = torch.where(chunk_valid, torch.gather(positions, 1, at), l)
      stage_tokens = torch.where(chunk_valid, torch.gather(stage_tokens, 1, at), PAD_ID)
      valid = chunk_valid
      if s + 1 < s_count:
        x = self.inner_encoders[s](chunks, positions, valid)
      else:
        out = self.main(chunks, positions, valid)
    for s in reversed(range(s_count)):
      lv = levels[s]
      bnd = lv['boundaries']
      if bnd.ema is not None:
        out = ema_chunks(out, bnd.ema, lv['index'])
      out = upsample(lv['x'], out, bnd.actions, bnd.gate)
      if s > 0:
        out = self.inner_decoders[s - 1](out, lv['positions'], lv['valid'])
    logits = self.head(self.decoder(out, levels[0]['positions']))
    return TokjaxCausalLMOutput(
        logits=logits,
        boundaries=tuple(lv['boundaries'].actions for lv in levels),
        boundary_logits=tuple(lv['boundaries'].logits for lv in levels),
        byte_boundaries=torch.stack(self._on_bytes(levels, l), dim=1),
        early_logits=early_logits,
        values=self.critic(h) if self.config.value_head else None,
    )

  @staticmethod
  def _on_bytes(levels, l):
    """Every stage's chunk ends marked on bytes: S float32[B, L]."""
    first = levels[0]['boundaries'].actions
    out = [first]
    for lv in levels[1:]:
      at = torch.where(lv['valid'], lv['positions'], l)
      ends = lv['boundaries'].actions * lv['valid']
      marks = torch.zeros(first.shape[0], l + 1, device=first.device)
      marks.scatter_reduce_(1, at, ends, reduce='amax')
      out.append(marks[:, :l])
    return out

  def _cached(self, tokens, cache):
    """Next-byte logits float32[B, L, V] of tokens int[B, L] that follow the cache's positions: a
    prompt (an empty cache) in one pass that fills the cache, later bytes one at a time."""
    b, l = tokens.shape
    if self.config.kind == 'flat':
      positions = cache.length + torch.arange(l, device=tokens.device).expand(b, l)
      cache.length += l
      return self.head(self.layers(self.embed(tokens), positions, None, cache.layers))
    if cache.length == 0 and l > 1:
      return self._read_prompt(tokens, cache)
    live = torch.ones(b, dtype=torch.bool, device=tokens.device)
    logits = []
    for i in range(l):
      pos = torch.full((b, 1), cache.length, dtype=torch.long, device=tokens.device)
      frame = self.encoder.frame(pos, None, cache.encoder)  # The decoder's too.
      h = self.encoder(self.embed(tokens[:, i : i + 1]), pos, None, cache.encoder, frame)
      # The policy decides from h alone; the other methods keep stage 0's early logits.
      early = None if isinstance(self.boundary, Policy) else self.early_head(h)
      y = self._cached_stage(0, h, pos, live, cache, tokens[:, i], early_logits=early)
      logits.append(self.head(self.decoder(y, pos, None, cache.decoder, frame)))
      cache.length += 1
    return torch.cat(logits, dim=1)

  def _read_prompt(self, tokens, cache):
    """The forward over a prompt (open-ended, no chunk capacity) that keeps what `_cached_stage`
    reads next: every layer's keys, each stage's last decisions (or the positions its method reads),
    position count and latest chunk output."""
    b, l = tokens.shape
    positions = torch.arange(l, device=tokens.device).expand(b, l)
    frame = self.encoder.frame(positions, None, cache.encoder)  # The decoder's too.
    h = self.encoder(self.embed(tokens), positions, None, cache.encoder, frame)
    valid = torch.ones_like(positions, dtype=torch.bool)
    y = self._prompt_stage(0, h, positions, valid, cache, tokens, early_logits=self.early_head(h))
    cache.length = l
    return self.head(self.decoder(y, positions, None, cache.decoder, frame))

  def _prompt_stage(self, s, x, positions, valid, cache, tokens, *, early_logits):
    """Stage s over its whole input x: [B, N, D] (valid: bool[B, N], the positions that exist,
    first; tokens: int[B, N] the byte each ends on; early_logits: stage 0's, else None) -> what the
    level below reads at each position, as `_cached_stage` one at a time."""
    method = self.boundary if s == 0 else self.inner_boundaries[s - 1]
    n = x.shape[1]
    bnd = _greedy_with_spare(method, x, tokens, early_logits)
    actions = bnd.actions[:, :n] * valid
    st = cache.stage(s, x[:, :1])
    count = valid.long().sum(-1)
    w = st['history'].shape[1]
    if w:
      idx = count[:, None] - w + torch.arange(w, device=x.device)
      taken = torch.gather(actions, 1, idx.clamp(min=0))
      st['history'] = torch.where(idx >= 0, taken, 0.0)
    st['seen'] = count
    if not isinstance(method, Policy):  # Its later decisions read these positions again.
      st.update(x=x, tokens=tokens, early_logits=early_logits)
    chunks, ends, chunk_valid = downsample(x, actions, n)
    at = ends.clamp(max=n - 1)
    chunk_pos = torch.where(chunk_valid, torch.gather(positions, 1, at), n)
    chunk_tokens = torch.where(chunk_valid, torch.gather(tokens, 1, at), PAD_ID)
    if s + 1 < self.num_stages:
      inner = self.inner_encoders[s](chunks, chunk_pos, chunk_valid, cache.inner_encoders[s])
      out = self._prompt_stage(
          s + 1, inner, chunk_pos, chunk_valid, cache, chunk_tokens, early_logits=None
      )
    else:
      out = self.main(chunks, chunk_pos, chunk_valid, cache.main)
    if bnd.ema is not None:
      out = ema_chunks(out, bnd.ema[:, :n], ends)
    latest = (chunk_valid.long().sum(-1) - 1).clamp(min=0)
    st['last'] = torch.gather(out, 1, latest[:, None, None].expand(-1, 1, out.shape[-1]))
    y = upsample(x, out, actions, None if bnd.gate is None else bnd.gate[:, :n])
    if s:
      y = self.inner_decoders[s - 1](y, positions, valid, cache.inner_decoders[s - 1])
    return y

  @staticmethod
  def _decide(method, st, x, token, early_logits, live):
    """A method other than the policy at a stage's new position (x: [B, 1, D], token: int[B],
    early_logits: [B, 1, V] at stage 0): it runs over the stage's positions so far and a spare one,
    as the forward does over the whole row; its decision at the new one is the forward's, since the
    method is causal. -> (a float32[B], gate float32[B] or None, H-Net's smoothing p or None)."""
    seen = st['seen']
    st['x'] = _put(st['x'], seen, x[:, 0], live, 0.0)
    st['tokens'] = _put(st['tokens'], seen, token, live, PAD_ID)
    if early_logits is not None:
      st['early_logits'] = _put(st['early_logits'], seen, early_logits[:, 0], live, 0.0)
    n = st['x'].shape[1]
    early = None if early_logits is None else st['early_logits']
    bnd = _greedy_with_spare(method, st['x'], st['tokens'], early)
    at = seen.clamp(max=n - 1)[:, None]
    take = lambda v: None if v is None else torch.gather(v, 1, at)[:, 0]
    return take(bnd.actions) * live, take(bnd.gate), take(bnd.ema)

  def _cached_stage(self, s, x, pos, live, cache, token, *, early_logits):
    """Stage s at one position whose input x: [B, 1, D] exists in rows `live` (bool[B]: stage s - 1
    closed a chunk there; token: int[B], the byte it ends on; early_logits: stage 0's at it) -> the
    state the level below reads there: x plus the output of the latest chunk complete at it (H-Net's
    smoothing and gate applied), through stage s's chunk decoder for s >= 1.

    The decision is the forward's: forced at a stage's first position, greedy after it, no chunk
    capacity; the forward's forced last boundary falls on its spare position, never here. The
    policy decides from this position's state and its last decisions (`Policy.step_logit`); other
    methods rerun over the stage's positions so far (`_decide`).
    """
    method = self.boundary if s == 0 else self.inner_boundaries[s - 1]
    st = cache.stage(s, x)
    gate = p = None
    if isinstance(method, Policy):
      logit = method.step_logit(x[:, 0], st['history'])
      a = torch.where(st['seen'] == 0, 1.0, (logit > 0).float()) * live
    else:
      a, gate, p = self._decide(method, st, x, token, early_logits, live)
    if st['history'].shape[1]:
      shifted = torch.cat([st['history'][:, 1:], a[:, None]], dim=1)
      st['history'] = torch.where(live[:, None], shifted, st['history'])
    st['seen'] = st['seen'] + live.long()
    close = a > 0.5
    if s + 1 < self.num_stages:
      inner = self.inner_encoders[s](x, pos, close[:, None], cache.inner_encoders[s])
      out = self._cached_stage(s + 1, inner, pos, close, cache, token, early_logits=None)
    elif bool(close.any()):
      out = self.main(x, pos, close[:, None], cache.main)
    else:  # No row closes a chunk: the main network would write nothing that is read.
      out = st['last']
    if p is not None:  # zbar_j = P_j z_j + (1 - P_j) zbar_{j-1}.
      out = p[:, None, None] * out + (1.0 - p[:, None, None]) * st['last']
    st['last'] = torch.where(close[:, None, None], out, st['last'])
    y = x + (st['last'] if gate is None else gate[:, None, None] * st['last'])
    if s:
      y = self.inner_decoders[s - 1](y, pos, live[:, None], cache.inner_decoders[s - 1])
    return y

  @classmethod
  def _supports_default_dynamic_cache(cls) -> bool:
    return False  # Not transformers' per-layer cache: the model makes its own (`TokjaxCache`).

  def prepare_inputs_for_generation(
      self, input_ids, next_sequence_length=None, cache=None, attention_mask=None, **kwargs
  ):
    """The whole row for the uncached forward; the new bytes only once there is a cache."""
    use_cache = bool(kwargs.get('use_cache', True))
    if cache is not None:
      input_ids = input_ids[:, cache.length :]
    return {
        'input_ids': input_ids,
        'attention_mask': None if cache is not None else attention_mask,
        'generation': True,
        'cache': cache,
        'use_cache': use_cache,
    }


class TokjaxCache:
  """What the cached forward keeps of the positions it has read (`TokjaxForCausalLM._cached`): the
  keys and values of every attention layer (byte layers their last byte_window positions, chunk
  layers every chunk), and for each stage its last w - 1 decisions (the policy) or the positions its
  method reads (any other method: their states, bytes and stage 0's early logits), how many
  positions it has read and the output of its latest complete chunk. The flat model: its layers'."""

  def __init__(self, model):
    c = model.config
    layers = lambda stack, positions=None: StackCache(
        len(stack.blocks), positions or KeyPositions()
    )
    self.length = 0
    # Made without gradients, it is read and written in inference mode (see `forward`).
    self.inference = not torch.is_grad_enabled()
    if c.kind == 'flat':
      self.layers = layers(model.layers, KeyPositions(c.byte_window))
      return
    # The byte stacks read the same positions: one record, extended once a call (`Stack.frame`).
    byte_positions = KeyPositions(c.byte_window)
    self.encoder = layers(model.encoder, byte_positions)
    self.decoder = layers(model.decoder, byte_positions)
    # Chunk stacks keep every chunk: their window counts bytes, through the positions.
    self.main = layers(model.main)
    self.inner_encoders = [layers(stack) for stack in model.inner_encoders]
    self.inner_decoders = [layers(stack) for stack in model.inner_decoders]
    methods = [model.boundary, *model.inner_boundaries]
    self.windows = [getattr(m, 'window', 1) for m in methods]  # The policy's; 1: no history.
    self.stages: list[dict | None] = [None] * len(self.windows)

  def stage(self, s: int, x) -> dict:
    """Stage s's state, started on the first call (x: [B, 1, D] gives the shapes)."""
    if self.stages[s] is None:
      b = x.shape[0]
      self.stages[s] = {
          'history': torch.zeros(b, self.windows[s] - 1, device=x.device),
          'seen': torch.zeros(b, dtype=torch.long, device=x.device),
          'last': torch.zeros_like(x),
          # Another method than the policy: its input, tokens and early logits so far.
          'x': None,
          'tokens': None,
          'early_logits': None,
      }
    return cast(dict, self.stages[s])  # Started above when it was None.

  def get_seq_length(self, layer_idx: int = 0) -> int:
    del layer_idx
    return self.length
