"""Transformer building blocks shared by every tokjax model (Gemma-2 style).

A block is RMSNorm before *and* after each sublayer, rotary position embeddings (RoPE) at explicit
positions, and a GeGLU MLP. Attention is causal; with `window > 0` it is sliding-window causal and, for
sequences longer than the window, computed block-locally at O(L x window) cost instead of O(L^2).

One block implementation serves training and decoding: called with a key/value `cache`, attention
writes the new positions' keys and values into it and attends over the cache, which is how
`tokjax.decoding` feeds one byte at a time through the very modules the model trains with.

Memory and speed options of a `Stack` (each a config field, see `stack_options`):
  remat: 'none' | 'dots' | 'full', a `jax.checkpoint` policy per stack ('dots' keeps the results of
    matrix multiplications without batch dimensions, `dots_with_no_batch_dims_saveable`, and recomputes
    the rest; 'full' keeps only each block's input);
  scan: the blocks as one `nn.scan` over stacked parameters (compile time flat in depth; the
    parameter tree differs, see `scan_params` / `unscan_params`);
  attention: 'blocked' (the implementations below) | 'dot_product' (`jax.nn.dot_product_attention`,
    implementation chosen by jax: XLA in jax 0.10) | 'cudnn' (the same, forced onto cuDNN's fused
    kernel: GPU, bfloat16 or float16 only).

Every parameter carries logical axis names (`embed`, `heads`, `kv`, `mlp`, `vocab`), which
`tokjax.sharding` maps onto mesh axes; on one device they are inert.

Shape names: B batch, L sequence length, D model width, H heads, K head width, F MLP width, W window.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any

_NEG_INF = -1e9  # Finite, so fully masked rows (padding) give a uniform softmax, not NaNs.


def _init(scale: float, axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=scale), axes)


class RMSNorm(nn.Module):
  """RMSNorm with a zero-initialised (1 + scale) gain, as in Gemma."""

  eps: float = 1e-6
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    # Read unboxed (an array); flax types it as the partitioned box its initializer returns.
    scale: jax.Array = self.param(  # type: ignore[assignment]
        'scale',
        nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
        (x.shape[-1],),
        jnp.float32,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * (1.0 + scale)).astype(self.dtype)


def apply_rope(x, positions, max_wavelength: float = 10_000.0):
  """Rotates x: [B, L, H, K] by angles set by integer positions: [B, L] (which need not be 0..L-1)."""
  half = x.shape[-1] // 2
  freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions[..., None, None].astype(jnp.float32) * freq  # [B, L, 1, K/2]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _softmax_attend(q, k, v, mask):
  """q: [..., Q, H, K], k/v: [..., S, H, K], mask: bool[..., Q, S] -> [..., Q, H, K]."""
  scores = jnp.einsum('...qhk,...shk->...hqs', q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1])
  scores = jnp.where(mask[..., None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum('...hqs,...shk->...qhk', probs, v)


def full_causal_attention(q, k, v, q_pos, k_pos, key_valid=None, *, window: int = 0):
  """Dense causal attention over explicit positions (byte positions of chunks, for instance).

  q: [B, Q, H, K], k/v: [B, S, H, K], q_pos: [B, Q], k_pos: [B, S], key_valid: bool[B, S] or None.
  A query attends to keys with k_pos <= q_pos (and q_pos - k_pos < window when window > 0).
  """
  mask = k_pos[:, None, :] <= q_pos[:, :, None]
  if window > 0:
    mask &= (q_pos[:, :, None] - k_pos[:, None, :]) < window
  if key_valid is not None:
    mask &= key_valid[:, None, :]
  return _softmax_attend(q, k, v, mask)


def local_causal_attention(q, k, v, window: int, splits: int = 2):
  """Sliding-window causal attention at O(L x window) over q/k/v: [B, L, H, K] at positions 0..L-1.

  Queries go in blocks of S = W / splits (W when splits does not divide it); each block sees its own
  block and the `splits` blocks before it, (splits + 1) * S keys masked to the last W positions.
  splits = 1 is the classic "own and previous block of W" scheme; splits = 2 scores 3/4 as many
  keys for the same result (masked keys weigh exactly 0 either way). The blocks are laid out heads
  first, so that the score products batch over leading axes (no transposes around them), and the
  mask is an additive bias: on one CPU thread a byte block's forward and backward at (16, 512) took
  about a fifth less time than with `_softmax_attend`'s layout and select (276 to 224 ms).
  """
  if window % splits:
    splits = 1
  size = window // splits
  b, l, h, d = q.shape
  pad = (-l) % size
  n = (l + pad) // size
  # [B, L, H, K] -> [B, H, n, S, K]; padding goes at the end, so real (earlier) queries never see it.
  blocks = lambda t: jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, size, h, d)
  qb, kb, vb = (blocks(t).transpose(0, 3, 1, 2, 4) for t in (q, k, v))
  shift = lambda t, m: jnp.pad(t, ((0, 0), (0, 0), (m, 0), (0, 0), (0, 0)))[:, :, :-m]
  frame = lambda t: jnp.concatenate([shift(t, m) for m in range(splits, 0, -1)] + [t], axis=3)
  k2, v2 = frame(kb), frame(vb)  # [B, H, n, (splits + 1) S, K]
  qi = jnp.arange(size)[:, None] + splits * size  # Query offsets in the key frame.
  ki = jnp.arange((splits + 1) * size)[None, :]
  mask = (ki <= qi) & (qi - ki < window)
  # Blocks near the start have fewer than `splits` blocks before them.
  exists = (jnp.arange(n)[:, None, None] - splits + ki[None] // size) >= 0
  bias = jnp.where(mask[None] & exists, 0.0, _NEG_INF).astype(jnp.float32)  # [n, S, (splits + 1) S]
  scores = jnp.einsum('bhnqk,bhnsk->bhnqs', qb * d**-0.5, k2).astype(jnp.float32) + bias
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum('bhnqs,bhnsk->bnqhk', probs, v2)
  return out.reshape(b, n * size, h, d)[:, :l]


def sorted_causal_attention(
    q, k, v, positions, key_valid=None, *, window: int = 0, block: int = 64
):
  """`full_causal_attention` for self-attention whose keys are in position order, valid ones first
  (byte positions 0..L-1, `chunking.downsample`'s buffer). Key slot j > i is then never seen by query
  i, so queries go in blocks of `block` and block m reads only the first (m + 1) * block keys:
  about half the score matrix of a long sequence is never computed. Same result as the dense path
  for every query that sees at least one key (a padding query that sees none averages over a
  different set of keys; nothing reads it).

  q/k/v: [B, L, H, K], positions: int[B, L], key_valid: bool[B, L] or None -> [B, L, H, K].
  """
  l = q.shape[1]
  outs = []
  for start in range(0, l, block):
    stop = min(start + block, l)
    kv = slice(0, stop)
    outs.append(
        full_causal_attention(
            q[:, start:stop],
            k[:, kv],
            v[:, kv],
            positions[:, start:stop],
            positions[:, kv],
            None if key_valid is None else key_valid[:, kv],
            window=window,
        )
    )
  return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]


def dot_product_causal_attention(
    q, k, v, *, window: int = 0, num_keys=None, implementation=None, positions=None
):
  """Causal attention through `jax.nn.dot_product_attention`: the same as the blocked path.

  q/k/v: [B, L, H, K] with keys in position order; num_keys: int32[B] or None, the number of valid
  keys (a prefix: true of byte positions 0..L-1 and of `chunking.downsample`'s buffer, whose valid
  chunk ends increase). For such inputs "slot j <= slot i" is "k_pos <= q_pos", so the mask equals
  `full_causal_attention`'s. window > 0 keeps keys with q_pos - k_pos < window, measured in
  positions: int[B, L] when given (chunk buffers, whose positions are the bytes where chunks end, as
  on the blocked path), else in slots, which are the positions 0..L-1 of byte layers
  (`local_window_size`). implementation: None (jax's choice) | 'xla' | 'cudnn' (which takes the
  position mask as an additive bias).
  """
  mask = None
  if window > 0 and positions is not None:
    mask = (positions[:, None, :, None] - positions[:, None, None, :]) < window  # [B, 1, L, L]
  return jax.nn.dot_product_attention(
      q,
      k,
      v,
      mask=mask,
      is_causal=True,
      key_value_seq_lengths=None if num_keys is None else num_keys.astype(jnp.int32),
      local_window_size=(window - 1, 0) if window > 0 and mask is None else None,
      implementation=implementation,
  )


ATTENTION_IMPLS = ('blocked', 'dot_product', 'cudnn')


def write_rows(buf, index, value, write):
  """buf: [B, T, ...] with value: [B, ...] written at index: int32[B] in each row where write: bool[B].

  A scatter of one slot per row (a row that does not write aims past the end, which drops it): in a
  decoding loop it updates the buffer in place, where a select would rewrite every slot.
  """
  at = jnp.where(write, index, buf.shape[1])
  return buf.at[jnp.arange(buf.shape[0]), at].set(value, mode='drop')


def _write_cache(cache, k, v, positions, slot, write):
  """The cache with the new positions' keys/values written at `slot` where `write` is true.

  cache: {k, v: [B, S, H, K], pos: int32[B, S], valid: bool[B, S]}; k/v: [B, Q, H, K] of which only
  Q = 1 is supported; positions, slot: int32[B, 1]; write: bool[B].
  """
  put = lambda x, value: write_rows(x, slot[:, 0], value, write)
  return {
      'k': put(cache['k'], k[:, 0]),
      'v': put(cache['v'], v[:, 0]),
      'pos': put(cache['pos'], positions[:, 0]),
      'valid': put(cache['valid'], True),
  }


def prefix_lengths(slots: int, *, parts: int = 4, multiple: int = 64) -> tuple[int, ...]:
  """The lengths `on_occupied_prefix` picks from for a buffer of `slots`: up to `parts` of them,
  multiples of `multiple` (the query block of `sorted_causal_attention`), the last one `slots`.

  A buffer of fewer than four multiples gets (slots,), the whole buffer: at L = 256 and capacity 128
  (the default config) the 16 rows' chunks at rate 0.2 often pass 64, and the step took as long
  with the switch as without it (one core, 16 x 256), its compile 2-5 s longer.
  """
  if slots < 4 * multiple:
    return (slots,)
  rounded = lambda n: min(slots, -(-n // multiple) * multiple)
  return tuple(sorted({rounded(-(-slots * (i + 1) // parts)) for i in range(parts)}))


def on_occupied_prefix(fn, params, x, positions, valid, lengths: tuple[int, ...]):
  """fn(params, x, positions, valid) -> [B, N', D] computed on the first P slots of a chunk buffer
  only, P the shortest of `lengths` that holds every row's valid slots; the slots past P are zeros.

  x: [B, N, D], positions: int[B, N], valid: bool[B, N] (a prefix of each row, as
  `chunking.downsample` leaves it). A chunk buffer is sized for the most chunks a row may have (say
  L/2 slots for a rate of about 0.2), so most of it is padding that no valid slot reads; a stack of
  causal layers gives its valid slots the same values on any prefix that holds them. The prefix is
  picked at run time by `lax.switch`, one branch per length. Its backward pass recomputes the chosen
  branch's forward: differentiating the switch directly would make every branch return every other
  branch's residuals (zeros at their shapes), which costs more than the recomputation.
  """
  n = x.shape[1]
  if len(lengths) == 1:
    return fn(params, x, positions, valid)
  index = jnp.searchsorted(jnp.asarray(lengths), jnp.max(jnp.sum(valid, axis=1)))

  def branch(p):
    def run(params, x):
      y = fn(params, x[:, :p], positions[:, :p], valid[:, :p])
      return jnp.pad(y, ((0, 0), (0, n - p), (0, 0)))

    return run

  @jax.custom_vjp
  def prefix(params, x):
    return jax.lax.switch(index, [branch(p) for p in lengths], params, x)

  def forward(params, x):
    return prefix(params, x), (params, x)

  def backward(saved, grad):
    pullback = lambda p: lambda params, x, g: jax.vjp(branch(p), params, x)[1](g)
    return jax.lax.switch(index, [pullback(p) for p in lengths], *saved, grad)

  prefix.defvjp(forward, backward)
  return prefix(params, x)


class Attention(nn.Module):
  """Multi-head causal self-attention with RoPE; sliding-window when `window > 0`.

  Without a cache it attends within x; with one (decoding, one new position per call) it writes the
  new key/value into cache slot `slot` where `write` is true and attends over every valid cached key
  at a position <= its own (within `window`), returning (output, updated cache).
  """

  num_heads: int
  window: int = 0
  dtype: Dtype = jnp.float32
  attention: str = 'blocked'

  @nn.compact
  def __call__(self, x, positions, key_valid=None, cache=None, slot=None, write=None):
    """x: [B, L, D], positions: int[B, L], key_valid: bool[B, L] or None -> [B, L, D].

    With cache ({k, v: [B, S, H, K], pos: int32[B, S], valid: bool[B, S]}), L = 1, slot: int32[B]
    and write: bool[B] -> ([B, 1, D], updated cache).
    """
    d = x.shape[-1]
    head_dim = d // self.num_heads
    # One matmul against the three kernels stacked as [D, 3, H, K] (see GeGLU).
    kernel = lambda name: Kernel(
        (d, self.num_heads, head_dim), d**-0.5, ('embed', 'heads', 'kv'), name=name
    )()
    w = jnp.stack([kernel('query'), kernel('key'), kernel('value')], axis=1).astype(self.dtype)
    qkv = jnp.einsum('bld,dthk->blthk', x.astype(self.dtype), w)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    if cache is not None:
      cache = _write_cache(cache, k, v, positions, slot[:, None], write)
      out = full_causal_attention(
          q, cache['k'], cache['v'], positions, cache['pos'], cache['valid'], window=self.window
      )
    elif self.attention != 'blocked':
      impl = 'cudnn' if self.attention == 'cudnn' else None
      # With key_valid the rows are chunk buffers (positions are the bytes where chunks end), so a
      # window counts bytes through a position mask, as on the blocked path; byte layers (no
      # key_valid) run at positions 0..L-1, where slots are bytes.
      num_keys = None if key_valid is None else jnp.sum(key_valid, axis=-1)
      at = None if key_valid is None else positions
      out = dot_product_causal_attention(
          q, k, v, window=self.window, num_keys=num_keys, implementation=impl, positions=at
      )
    # Byte layers run at positions 0..L-1 with no padding inside a row, which block-local attention
    # relies on; anything else (chunks, short sequences) takes the dense path, whose keys are in
    # position order with the valid ones first (what sorted_causal_attention relies on).
    elif self.window > 0 and key_valid is None and x.shape[1] > 2 * self.window:
      out = local_causal_attention(q, k, v, self.window)
    else:
      out = sorted_causal_attention(q, k, v, positions, key_valid, window=self.window)
    w_out = Kernel((self.num_heads, head_dim, d), d**-0.5, ('heads', 'kv', 'embed'), name='out')()
    out = jnp.einsum('blhk,hkd->bld', out, w_out.astype(self.dtype))
    return out if cache is None else (out, cache)


class Kernel(nn.Module):
  """A bare weight named `kernel`: lets one matmul read several layers' weights (see GeGLU) while the
  parameter tree stays that of separate `nn.Dense` / `nn.DenseGeneral` layers."""

  shape: tuple[int, ...]
  scale: float
  axes: tuple[str, ...]

  @nn.compact
  def __call__(self):
    return self.param('kernel', _init(self.scale, self.axes), self.shape, jnp.float32)


class GeGLU(nn.Module):
  """Gated MLP: down(gelu(gate(x)) * up(x)), hidden width F.

  gate and up are one matmul against their kernels stacked as [D, 2, F] (on CPU about a third
  faster than two, and the same numbers: each output element is the same dot product); the stacked
  axis is new, so a tensor-parallel split of F stays where it is.
  """

  hidden: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    d, f = x.shape[-1], self.hidden
    gate = Kernel((d, f), d**-0.5, ('embed', 'mlp'), name='gate')()
    up = Kernel((d, f), d**-0.5, ('embed', 'mlp'), name='up')()
    w = jnp.stack([gate, up], axis=1).astype(self.dtype)  # [D, 2, F]
    gu = jnp.einsum('...d,dtf->...tf', x.astype(self.dtype), w)
    h = nn.with_logical_constraint(
        nn.gelu(gu[..., 0, :]) * gu[..., 1, :], ('batch', 'length', 'mlp')
    )
    down = Kernel((f, d), f**-0.5, ('mlp', 'embed'), name='down')().astype(self.dtype)
    return jnp.einsum('...f,fd->...d', h, down)


@dataclasses.dataclass(frozen=True)
class StackSettings:
  """What a `Stack` builds: num_layers blocks of num_heads heads and a GeGLU of width mlp_hidden,
  attending within window positions (0: full causal attention; see `Attention`), computing in dtype,
  with the memory and speed options remat, scan and attention (see the module docstring and
  `stack_options`)."""

  num_layers: int
  num_heads: int
  mlp_hidden: int
  window: int = 0
  dtype: Dtype = jnp.float32
  remat: str = 'none'
  scan: bool = False
  attention: str = 'blocked'


class Block(nn.Module):
  """Gemma-2 block: x + post_norm(attn(pre_norm(x))), then x + post_norm(mlp(pre_norm(x))).

  With a key/value `cache` (see `Attention`) it returns (x, updated cache). settings: its `Stack`'s
  (num_layers, remat and scan are the stack's business).
  """

  settings: StackSettings

  @nn.compact
  def __call__(self, x, positions, key_valid=None, cache=None, slot=None, write=None):
    s = self.settings
    h = Attention(s.num_heads, s.window, s.dtype, s.attention, name='attn')(
        RMSNorm(dtype=s.dtype, name='pre_attn_norm')(x), positions, key_valid, cache, slot, write
    )
    if cache is not None:
      h, cache = h
    x = x + RMSNorm(dtype=s.dtype, name='post_attn_norm')(h)
    h = GeGLU(s.mlp_hidden, s.dtype, name='mlp')(RMSNorm(dtype=s.dtype, name='pre_mlp_norm')(x))
    x = x + RMSNorm(dtype=s.dtype, name='post_mlp_norm')(h)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    return x if cache is None else (x, cache)


class _ScanBlock(nn.Module):
  """A `Block` in `nn.scan`'s calling convention: (carry x, per-layer cache) -> (x, cache)."""

  settings: StackSettings

  @nn.compact
  def __call__(self, x, cache, positions, key_valid, slot, write):
    out = Block(self.settings, name='block')(x, positions, key_valid, cache, slot, write)
    return out if cache is not None else (out, None)


REMAT_POLICIES = {
    'none': None,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    'full': jax.checkpoint_policies.nothing_saveable,
}

SCAN_NAME = (
    'blocks'  # Stack/blocks/block/...: the scanned layers' parameters, leading axis = layer.
)


class Stack(nn.Module):
  """`settings.num_layers` blocks in sequence (see the module docstring for remat, scan and
  attention).

  Called with caches (a list of one cache per block) it returns (x, updated caches).
  """

  settings: StackSettings

  @nn.compact
  def __call__(self, x, positions, key_valid=None, caches=None, slot=None, write=None):
    s = self.settings
    if s.scan and s.num_layers:
      step = _ScanBlock
      if s.remat != 'none':
        step = nn.remat(step, policy=REMAT_POLICIES[s.remat], prevent_cse=False)
      stacked = None if caches is None else jax.tree.map(lambda *c: jnp.stack(c), *caches)
      scanned = nn.scan(
          step,
          variable_axes={'params': 0},
          split_rngs={'params': True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
          length=s.num_layers,
          metadata_params={nn.PARTITION_NAME: 'layers'},
      )
      x, stacked = scanned(s, name=SCAN_NAME)(x, stacked, positions, key_valid, slot, write)
      if caches is None:
        return x
      return x, [jax.tree.map(lambda c, i=i: c[i], stacked) for i in range(s.num_layers)]
    block = Block
    if s.remat != 'none':
      block = nn.remat(block, policy=REMAT_POLICIES[s.remat])
    new_caches = []
    for i in range(s.num_layers):
      cache = None if caches is None else caches[i]
      x = block(s, name=f'block_{i}')(x, positions, key_valid, cache, slot, write)
      if caches is not None:
        x, cache = x
        new_caches.append(cache)
    return x if caches is None else (x, new_caches)


def scan_params(tree):
  """Parameters of unrolled stacks (block_0 .. block_{n-1}) in the scanned layout, leaves stacked.

  Works on any params tree (a whole model's): every dict whose keys are exactly block_0..block_{n-1}
  becomes {SCAN_NAME: {'block': stacked}}. Optimizer states are not converted: a scanned model is a
  fresh-run option, or a way to run an unrolled checkpoint's parameters.
  """
  if not isinstance(tree, dict):
    return tree
  n = len(tree)
  if n and set(tree) == {f'block_{i}' for i in range(n)}:
    blocks = [tree[f'block_{i}'] for i in range(n)]
    return {SCAN_NAME: {'block': jax.tree.map(lambda *x: jnp.stack(x), *blocks)}}
  return {k: scan_params(v) for k, v in tree.items()}


def unscan_params(tree):
  """The inverse of `scan_params`: scanned stacks back to block_0 .. block_{n-1}."""
  if not isinstance(tree, dict):
    return tree
  if set(tree) == {SCAN_NAME} and isinstance(tree[SCAN_NAME], dict):
    if set(tree[SCAN_NAME]) == {'block'}:
      stacked = tree[SCAN_NAME]['block']
      n = jax.tree.leaves(stacked)[0].shape[0]
      return {f'block_{i}': jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)}
  return {k: unscan_params(v) for k, v in tree.items()}


def stack_options(model_config) -> dict:
  """The memory and speed options of config.model, checked (UserError), as Stack keyword values.

  Returns {'remat': {'encoder', 'main', 'decoder': policy name}, 'scan_layers': bool,
  'attention': str}.
  """
  from tokjax.errors import UserError  # pylint: disable=g-import-not-at-top

  remat = dict(model_config.remat or {})
  unknown = set(remat) - {'encoder', 'main', 'decoder'}
  if unknown:
    raise UserError(
        f'config.model.remat has unknown stack(s) {sorted(unknown)}; its fields are encoder, main, '
        'decoder (the flat model uses main).'
    )
  remat = {s: remat.get(s, 'none') for s in ('encoder', 'main', 'decoder')}
  for stack, policy in remat.items():
    if policy not in REMAT_POLICIES:
      raise UserError(
          f'config.model.remat.{stack}={policy!r} is not valid; use one of '
          f'{tuple(REMAT_POLICIES)}.'
      )
  attention = model_config.attention
  if attention not in ATTENTION_IMPLS:
    raise UserError(
        f'config.model.attention={attention!r} is not valid; use one of {ATTENTION_IMPLS}.'
    )
  if attention == 'cudnn' and (jax.default_backend() != 'gpu' or model_config.dtype == 'float32'):
    raise UserError(
        "config.model.attention='cudnn' needs a GPU and config.model.dtype='bfloat16' (cuDNN's "
        "fused attention has no float32 kernel); use 'dot_product' elsewhere."
    )
  scan = model_config.scan_layers
  if not isinstance(scan, bool):
    raise UserError(f'config.model.scan_layers={scan!r} must be True or False.')
  return {'remat': remat, 'scan_layers': scan, 'attention': attention}


class Embed(nn.Module):
  """Byte (+ special) embedding: ids int[B, L] -> [B, L, D]."""

  vocab_size: int
  d_model: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, ids):
    table = self.param(
        'embedding', _init(1.0, ('vocab', 'embed')), (self.vocab_size, self.d_model), jnp.float32
    )
    # Without the constraint the gathered rows inherit the table's fsdp split of `embed`, and XLA
    # rematerialises the whole activation to reshard it for the first block.
    return nn.with_logical_constraint(
        jnp.take(table, ids, axis=0).astype(self.dtype), ('batch', 'length', 'embed')
    )


class LMHead(nn.Module):
  """Final RMSNorm and an untied projection to next-byte logits: [B, L, D] -> float32[B, L, V].

  The norm and projection run in float32 whatever `dtype` the body uses: the rewards CE_early -
  CE_full are small differences of cross-entropies, and bfloat16 logits are rounded to 0.06-0.125 at
  |logit| 8-32; at vocabulary 258 the float32 matmul costs next to nothing. `dtype` is kept so that
  every layer takes the same arguments.
  """

  vocab_size: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = RMSNorm(dtype=jnp.float32, name='norm')(x)
    return nn.Dense(
        self.vocab_size,
        use_bias=False,
        dtype=jnp.float32,
        name='proj',
        kernel_init=_init(x.shape[-1] ** -0.5, ('embed', 'vocab')),
    )(x)
