"""Analytic FLOPs of a training step, accelerator peak FLOP/s, and model FLOP utilisation (MFU).

Counted: matrix multiplies (2 FLOPs per multiply-add) of the forward pass, times 3 for training
(backward = 2x forward), plus one forward pass per stage trained against a counterfactual reward
(`losses.counterfactual_stages`: its extra stop-gradient forward pass); elementwise work (norms,
softmax, GELU, the optimizer) is left out, as in the usual 6 N D accounting. Per sequence of L bytes:

  block on n positions, width d, MLP hidden F, k keys per query:
      8 n d^2 (q, k, v, out) + 6 n d F (GeGLU gate, up, down) + 4 n k d (scores, values)
  hierarchical: encoder + decoder blocks on L bytes (sliding window W), main blocks on the chunks,
      the boundary policy's projection 2 L d w, two LM heads (early exit, final) 2 x 2 L d V;
      with S stages, each stage s >= 1 adds its encoder + decoder blocks on the chunks of stage s - 1,
      its policy's projection there and its early-exit head 2 L d V, and the main blocks run on the
      chunks of the last stage
  flat: blocks on L bytes, one LM head.

Two counts, both from `step_flops`:
  * model FLOPs (`rate` given): the work the method needs. The main network runs on the REALISED
    number of chunks, rate x L per sequence (the train step's metrics carry `rate`), with causal
    attention over the chunks so far; byte layers see min(t + 1, W) keys. This is the count for MFU.
  * executed FLOPs (`rate=None`): what the compiled step computes at most. The main network runs on
    all `capacity` chunk slots with full C x C scores, and blocked sliding-window attention scores 2W
    keys per query. A chunk stack that runs on the occupied prefix of its buffer
    (`layers.on_occupied_prefix`: a switch over prefix lengths) is counted at its longest branch,
    the whole buffer, as XLA counts a switch, and once more for its backward pass, which recomputes
    its forward. This is the count XLA's cost_analysis reports (tests/test_flops.py checks it to 10%
    on CPU).
"""

import time

from tokjax import losses, models
from tokjax import stages as stages_lib
from tokjax.data import VOCAB_SIZE
from tokjax.models import layers

TRAIN_MULTIPLIER = 3  # Forward + backward (gradients w.r.t. activations and weights).

# Dense bf16 peak FLOP/s per device as jax enumerates devices (one GPU, one TPU chip; per TensorCore
# where a chip shows as two devices, as v4 without megacore). Vendor datasheets, no sparsity.
PEAK_FLOPS = {
    'NVIDIA H100': 989e12,  # SXM; the PCIe card is 756e12.
    'NVIDIA H200': 989e12,
    'NVIDIA A100': 312e12,
    'TPU v4': 275e12,
    'TPU v5 lite': 197e12,  # v5e
    'TPU v5e': 197e12,
    'TPU v5': 459e12,  # v5p
    'TPU v5p': 459e12,
    'TPU v6 lite': 918e12,  # v6e (Trillium)
    'TPU v6e': 918e12,
}


def _block(n: float, d: int, hidden: int, keys: float) -> float:
  """Forward FLOPs of one transformer block on n positions with `keys` keys per query on average."""
  return 8 * n * d * d + 6 * n * d * hidden + 4 * n * keys * d


def _window_keys(seq_len: int, window: int, executed: bool) -> float:
  """Mean keys per query of a byte layer: sliding window W (0 = full causal)."""
  if window <= 0:
    return seq_len if executed else (seq_len + 1) / 2
  if executed:
    # Blocked local attention scores a 2W-key frame per query; short rows take the dense path.
    return 2 * window if seq_len > 2 * window else seq_len
  return sum(min(t + 1, window) for t in range(seq_len)) / seq_len


def forward_flops_per_sequence(config, rate=None, *, levels: stages_lib.Levels) -> float:
  """Forward FLOPs of one sequence of config.data.seq_len bytes (see the module docstring); levels:
  config's (`stages.resolve`).

  rate: None (executed count), the chunks per byte of stage 0, or a sequence with one rate per stage
  (stage s >= 1: boundaries per chunk of stage s - 1; a stage without one is costed at its target).
  """
  m, seq = config.model, config.data.seq_len
  d, v = m.d_model, VOCAB_SIZE
  executed = rate is None
  stages = models.num_stages(config)
  if not stages:  # The flat model: its one stage (built by no one) holds its window.
    keys = _window_keys(seq, levels[0].window, executed)
    return m.num_layers * _block(seq, d, m.mlp_ratio * d, keys) + 2 * seq * d * v
  rates = () if executed else (tuple(rate) if isinstance(rate, (tuple, list)) else (rate,))
  first = levels[0]
  byte_keys = _window_keys(seq, first.window, executed)
  layers_ = first.encoder_layers + first.decoder_layers
  total = layers_ * _block(seq, d, m.byte_mlp_ratio * d, byte_keys)
  total += 2 * seq * d * _policy_width(first) + 2 * (2 * seq * d * v)
  chunks = float(first.capacity) if executed else float(rates[0]) * seq
  for st in levels[1:stages]:
    n_in = chunks
    if executed:
      keys = n_in
      chunks = float(st.capacity)
    else:
      keys = (n_in + 1) / 2
      if st.window > 0:  # A window in bytes spans about window * n_in / L chunks.
        keys = min(keys, st.window * n_in / seq)
      chunks = n_in * float(rates[st.level] if st.level < len(rates) else st.target_rate)
    layers_ = st.encoder_layers + st.decoder_layers
    total += layers_ * _block(n_in, d, m.main_mlp_ratio * d, keys)
    total += 2 * n_in * d * _policy_width(st)
    total += 2 * seq * d * v  # The stage's early-exit head.
  chunk_keys = chunks if executed else (chunks + 1) / 2
  return total + m.main_layers * _block(chunks, d, m.main_mlp_ratio * d, chunk_keys)


def recomputed_flops_per_sequence(config, *, levels: stages_lib.Levels) -> float:
  """Forward FLOPs of one sequence's chunk stacks that run on the occupied prefix of their buffer,
  counted at the whole buffer: the extra forward their backward pass computes (executed count)."""
  m, d = config.model, config.model.d_model
  stages = models.num_stages(config)
  on_prefix = lambda slots: len(layers.prefix_lengths(slots)) > 1
  total, buffer = 0.0, levels[0].capacity if stages else 0
  for st in levels[1:stages]:
    if on_prefix(buffer):
      layers_ = st.encoder_layers + st.decoder_layers
      total += layers_ * _block(buffer, d, m.main_mlp_ratio * d, buffer)
    buffer = st.capacity
  if stages and on_prefix(buffer):
    total += m.main_layers * _block(buffer, d, m.main_mlp_ratio * d, buffer)
  return total


def _policy_width(stage) -> int:
  """The policy's window w at this stage (its logits cost 2 * d * w per position here), 0 for the
  other methods."""
  return stage.settings.window if stage.method == 'policy' else 0


def training_forwards(config, *, levels: stages_lib.Levels) -> int:
  """Forward passes' worth of work in one training step: TRAIN_MULTIPLIER, plus one per stage whose
  reward is a counterfactual (tokjax/losses.py); levels: config's."""
  return TRAIN_MULTIPLIER + len(losses.counterfactual_stages(config, levels=levels))


def step_flops(config, rate=None, *, levels: stages_lib.Levels) -> float:
  """Training FLOPs of one step of the global batch (config.data.batch_size x seq_len bytes);
  levels: config's (`stages.resolve`).

  rate: the step's realised chunks per byte (metrics['rate']) for model FLOPs; None for the FLOPs
  the compiled step executes (every chunk slot of the capacity).
  """
  forwards = training_forwards(config, levels=levels)
  per_sequence = forwards * forward_flops_per_sequence(config, rate, levels=levels)
  if rate is None:
    per_sequence += recomputed_flops_per_sequence(config, levels=levels)
  return config.data.batch_size * per_sequence


def flops_per_byte(config, rate=None, *, levels: stages_lib.Levels) -> float:
  """Training FLOPs per training byte (rate as in `step_flops`; default model count at target rate)."""
  forwards = training_forwards(config, levels=levels)
  return forwards * forward_flops_per_sequence(config, rate, levels=levels) / config.data.seq_len


def peak_flops(device=None, cpu_peak=None) -> float | None:
  """Peak FLOP/s of one device (jax.devices()[0] by default) from PEAK_FLOPS by its device_kind.

  GPU names match by prefix ('NVIDIA H100 80GB HBM3' -> H100). A CPU has no table entry: pass
  `cpu_peak` (e.g. from measure_matmul_peak()) or get None.
  """
  if device is None:
    import jax  # pylint: disable=g-import-not-at-top

    device = jax.devices()[0]
  if device.platform == 'cpu':
    return cpu_peak
  kind = device.device_kind
  if kind in PEAK_FLOPS:
    return PEAK_FLOPS[kind]
  for name in sorted(PEAK_FLOPS, key=len, reverse=True):
    if kind.startswith(name):
      return PEAK_FLOPS[name]
  return None


def measure_matmul_peak(n: int = 1024, dtype='float32', repeats: int = 5) -> float:
  """Best-of-`repeats` FLOP/s of an n x n x n matmul on the default device (the CPU's fp32 peak)."""
  import jax  # pylint: disable=g-import-not-at-top

  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def mfu(flops_per_step: float, step_seconds: float, peak_per_device: float, num_devices: int = 1):
  """Model FLOP utilisation: achieved FLOP/s over the devices' peak."""
  return flops_per_step / step_seconds / (peak_per_device * num_devices)
