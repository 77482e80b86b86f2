"""A tokjax run written as a transformers folder, behind a parity gate (see `tokjax.export`).

`export(checkpoint, out, step)` restores the run, maps its parameters into the PyTorch model of
modeling_tokjax.py (`mapping`), runs tokjax and PyTorch on the same bytes (`parity`) and only then
writes the folder: into a temporary folder beside `out`, renamed into place when complete, so a
refusal or a crash leaves nothing behind.
"""

import json
import os
import shutil
from typing import TYPE_CHECKING

import numpy as np

import tokjax
from tokjax import checkpointing, inspection, metric_writers, paths, stages
from tokjax.errors import UserError
from tokjax.export import mapping, spec

if TYPE_CHECKING:
  import jax  # For annotations only: parity imports jax where it runs.

TOLERANCE = 1e-4  # Largest |logit difference| the gate accepts (float32, given boundaries).
HERE = os.path.dirname(os.path.abspath(__file__))
REMOTE_FILES = ('configuration_tokjax.py', 'modeling_tokjax.py')
AUTO_MAP = {
    'AutoConfig': 'configuration_tokjax.TokjaxConfig',
    'AutoModelForCausalLM': 'modeling_tokjax.TokjaxForCausalLM',
    'AutoModel': 'modeling_tokjax.TokjaxForCausalLM',
}
PROBE_TEXT = (
    b"Shall I compare thee to a summer's day? Thou art more lovely and more temperate:\n"
    b"Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date."
)


def require_torch():
  """modeling_tokjax and torch, or UserError with the install line."""
  try:
    import safetensors  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    import torch  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
    import transformers  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError as e:
    raise UserError(
        f"exporting needs the optional extra ({e.name} is missing): pip install -e '.[export]'."
    ) from None
  from tokjax.export import modeling_tokjax  # pylint: disable=g-import-not-at-top

  return modeling_tokjax


def check_out(out: str) -> None:
  """UserError unless --out is a new or empty folder this process can create (`paths.check_writable`),
  checked before the run is read."""
  paths.check_writable(out, '--out')
  if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
    raise UserError(f'--out {out} exists and is not empty; pass a new or empty folder.')


def torch_model(hf_fields: dict, state: dict | None = None, *, modeling=None):
  """The PyTorch model of config.json fields, with the weights `state` ({name: array}) if given;
  modeling: the port module to build it from (default: this package's modeling_tokjax)."""
  import torch  # pylint: disable=g-import-not-at-top

  modeling = modeling or require_torch()
  model = modeling.TokjaxForCausalLM(modeling.TokjaxConfig(**hf_fields)).float().eval()
  if state is not None:  # Names and shapes are checked by `mapping.to_torch_state`.
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
  return model


def torch_state(hf_fields: dict, params) -> dict:
  """{PyTorch name: array} of tokjax params, checked against the model of hf_fields."""
  shapes = {k: tuple(v.shape) for k, v in torch_model(hf_fields).state_dict().items()}
  return mapping.to_torch_state(params, shapes)


def probe(seq_len: int) -> np.ndarray:
  """int32[3, seq_len]: the bytes the gate runs both models on. BOS then English text, BOS then
  code (this module's source), and BOS then random bytes."""
  from tokjax.vocab import BOS_ID  # pylint: disable=g-import-not-at-top

  with open(os.path.join(HERE, 'modeling_tokjax.py'), 'rb') as f:
    code = f.read()
  rng = np.random.default_rng(0)
  rows: list[bytes | np.ndarray] = [
      PROBE_TEXT * (seq_len // len(PROBE_TEXT) + 1),
      code,
      rng.integers(0, 256, seq_len),
  ]
  out = np.full((len(rows), seq_len), BOS_ID, np.int32)
  for i, row in enumerate(rows):
    row = np.frombuffer(row, np.uint8) if isinstance(row, bytes) else row
    out[i, 1:] = row[: seq_len - 1]
  return out


def parity(model, params, model_pt, tokens: 'np.ndarray | jax.Array') -> dict:
  """Runs the tokjax model (flax module and params) and the PyTorch model on tokens: int32[B, L]
  in float32.

  Returns {'given': the largest |logit difference| with the same boundaries at every stage (those
  tokjax samples with PRNGKey(0)), 'boundary_probs': the largest difference of sigmoid(boundary
  logit) at a valid position of any stage there (each method's own reading of its settings),
  'greedy': the logits' with greedy boundaries, 'greedy_mismatch': positions where a stage's greedy
  boundaries differ}. A flat model has one pass.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  model = model.clone(parent=None, dtype=jnp.float32, attention='blocked')
  key = jax.random.PRNGKey(0)

  @jax.jit
  def run(params, tokens, actions):
    if not model.num_stages:
      return model.apply({'params': params}, tokens).logits, ()
    mode = 'given' if actions is not None else 'greedy'
    out = model.apply({'params': params}, tokens, key, mode=mode, actions=actions)
    # Each stage's boundary probabilities where its positions exist (not an inner stage's padding).
    probs = tuple((jax.nn.sigmoid(s.boundaries.logits), s.valid) for s in out.stages)
    return out.logits, tuple(s.boundaries.actions for s in out.stages), probs

  @jax.jit
  def sampled(params, tokens):
    out = model.apply({'params': params}, tokens, key, mode='sample')
    return tuple(s.boundaries.actions for s in out.stages)

  def pt(**kw):
    with torch.no_grad():
      out = model_pt(input_ids=torch.from_numpy(np.asarray(tokens, np.int64)), **kw)
    probs = tuple(torch.sigmoid(x).numpy() for x in (out.boundary_logits or ()))
    return out.logits.numpy(), tuple(b.numpy() for b in (out.boundaries or ())), probs

  tokens = jnp.asarray(tokens)
  if not model.num_stages:
    ref = run(params, tokens, None)[0]
    diff = float(np.max(np.abs(np.asarray(ref) - pt()[0])))
    return {'given': diff, 'boundary_probs': 0.0, 'greedy': diff, 'greedy_mismatch': 0}
  given = sampled(params, tokens)
  ref, _, probs = run(params, tokens, given)
  got, _, got_probs = pt(boundaries=tuple(torch.from_numpy(np.array(a)) for a in given))
  ref_g, acts_g, _ = run(params, tokens, None)
  got_g, pt_acts, _ = pt()
  mismatch = sum(int(np.sum(np.asarray(a) != b)) for a, b in zip(acts_g, pt_acts))
  return {
      'given': float(np.max(np.abs(np.asarray(ref) - got))),
      'boundary_probs': max(
          float(np.max(np.abs(np.asarray(p) - q) * np.asarray(valid)))
          for (p, valid), q in zip(probs, got_probs)
      ),
      'greedy': float(np.max(np.abs(np.asarray(ref_g) - got_g))),
      'greedy_mismatch': mismatch,
  }


def gate(model, params, model_pt, seq_len: int) -> dict:
  """`parity` on `probe` bytes, or UserError with the largest difference."""
  found = parity(model, params, model_pt, probe(seq_len))
  if found['given'] > TOLERANCE or found['boundary_probs'] > TOLERANCE or found['greedy_mismatch']:
    raise UserError(
        f"parity check failed: the PyTorch logits differ from tokjax's by up to "
        f'{found["given"]:.3g} with given boundaries (tolerance {TOLERANCE:g}), the boundary '
        f'probabilities by up to {found["boundary_probs"]:.3g}, and '
        f'{found["greedy_mismatch"]} greedy boundaries differ; nothing was written (a bug of the '
        'exporter: please report it).'
    )
  return found


def val_bpb_at(run: str, step: int) -> float | None:
  """The val bpb the run's metrics.jsonl logged at `step` (None if it logged none there): the
  exported weights' own, never another step's."""
  path = os.path.join(run, 'metrics.jsonl')
  if not os.path.isfile(path):
    return None
  rows = [
      r
      for r in metric_writers.read_metrics(path)
      if r.get('split') == 'val' and 'bpb' in r and r.get('step') == step
  ]
  return float(rows[-1]['bpb']) if rows else None  # A resumed run's re-evaluation is the latest.


def export(checkpoint: str, out: str, step: int | None = None) -> dict:
  """Writes the export folder `out` of run `checkpoint` (see the module docstring); returns the
  gate's differences."""
  require_torch()
  check_out(out)
  mgr = inspection.inspection_manager(checkpoint)  # Not a run: one line.
  if step is not None and step not in mgr.all_steps():
    raise UserError(
        f'{checkpoint} has no checkpoint of step {step}; it has steps {sorted(mgr.all_steps())}.'
    )
  config = checkpointing.read_config(mgr, step if step is not None else mgr.latest_step())
  # Before restoring and compiling anything: the saved config's levels, apart from the opened run's.
  spec.check_exportable(config, levels=stages.resolve(config))
  ckpt = inspection.load_checkpoint(checkpoint, step)
  fields = spec.hf_config(ckpt.config, levels=ckpt.levels)
  state = torch_state(fields, ckpt.params)
  model_pt = torch_model(fields, state)
  found = gate(ckpt.model, ckpt.params, model_pt, int(ckpt.config.data.seq_len))
  bpb = val_bpb_at(checkpoint, ckpt.step)
  fields['tokjax'] = {
      'version': tokjax.__version__,
      'step': ckpt.step,
      'val_bpb': bpb,
      'val_bpb_step': None if bpb is None else ckpt.step,
      'parity': found,
      'config': json.loads(json.dumps(ckpt.config.to_dict(), default=list)),
  }
  write_folder(out, fields, state, ckpt)
  return found


def write_folder(out: str, fields: dict, state: dict, ckpt) -> None:
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top

  from tokjax.export import tokenizer  # pylint: disable=g-import-not-at-top

  modeling = require_torch()
  out = os.path.abspath(out)
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f'.{os.path.basename(out)}.partial-{os.getpid()}')
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    # Written by open(), as every other file of the folder, so its mode is theirs (the umask's):
    # safetensors' save_file creates its file private (0600).
    with open(os.path.join(tmp, 'model.safetensors'), 'wb') as f:
      f.write(save(state, metadata={'format': 'pt'}))
    config = modeling.TokjaxConfig(
        **fields, architectures=['TokjaxForCausalLM'], auto_map=AUTO_MAP, dtype='float32'
    )
    config.save_pretrained(tmp)
    for name in REMOTE_FILES:
      shutil.copy(os.path.join(HERE, name), os.path.join(tmp, name))
    tokenizer.save(tmp, int(ckpt.config.data.seq_len))
    _generation_config(tmp)
    with open(os.path.join(tmp, 'README.md'), 'w') as f:
      f.write(model_card(fields, ckpt))
    if os.path.isdir(out):
      os.rmdir(out)  # Empty (check_out).
    os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _generation_config(folder: str) -> None:
  from transformers import GenerationConfig  # pylint: disable=g-import-not-at-top

  from tokjax.vocab import BOS_ID, PAD_ID  # pylint: disable=g-import-not-at-top

  # Bytes only, never PAD or BOS, as tokjax's generation draws them.
  GenerationConfig(
      bos_token_id=BOS_ID, pad_token_id=PAD_ID, do_sample=False, suppress_tokens=[PAD_ID, BOS_ID]
  ).save_pretrained(folder)


def model_card(fields: dict, ckpt) -> str:
  t = fields['tokjax']
  c = ckpt.config
  stages = fields.get('stages') or []
  methods = ', '.join(s['method'] for s in stages) or 'none (flat Transformer)'
  if t['val_bpb'] is None:
    bpb = f"not logged at step {t['step']}"
  else:
    bpb = f"{t['val_bpb']:.4f} (step {t['val_bpb_step']})"
  return f"""---
library_name: transformers
tags: [tokjax, byte-level, custom_code]
---
# tokjax byte LM ({c.model.kind}, {len(stages)} stage(s))

Exported with `python -m tokjax.export` from tokjax {t['version']} (step {t['step']}).

- corpus: `{c.data.corpus}`, sequences of {c.data.seq_len} bytes
- training steps: {t['step']}
- val bpb: {bpb}
- boundary methods by stage: {methods}
- parity with tokjax (largest |logit difference|, float32): {t['parity']['given']:.2e} with given
  boundaries, {t['parity']['greedy']:.2e} with greedy ones ({t['parity']['greedy_mismatch']} greedy
  boundaries differ)

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
out = model(**tok(["To be, or not to be"], return_tensors="pt"))  # out.logits, out.boundaries
```

Ids are bytes 0..255, PAD 256, BOS 257. The training config is config.json's `tokjax.config`:

```json
{json.dumps(t['config'], indent=1)}
```
"""
