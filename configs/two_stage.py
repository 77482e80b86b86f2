r"""Two levels of learned boundaries at CPU size: bytes -> chunks -> chunks of chunks.

  python -m tokjax.train --config configs/two_stage.py
  python -m tokjax.train --config configs/two_stage.py:hnet        # a rival at both levels
  python -m tokjax.train --config configs/two_stage.py:learned,tiny  # smoke-test size

configs/default.py's model and run (d_model 128, L = 256, B = 16, 600 steps on `stdlib_docs`) with a
second stage (config.model.stages = 2): stage 0 draws chunk ends over bytes at target rate 0.2 (as in
the one-stage model), stage 1 draws ends over those chunks at target rate 0.33 (about three chunks per
stage-1 chunk), with one chunk layer before and one after it, and the two main layers run on the
stage-1 chunks. Every decision at both levels is learned by the score function against its own early
exit (tokjax/estimator.py). The run ends by printing held-out text with '|' at stage-0 chunk ends and
'||' where a stage-1 chunk ends too.

The stage-1 layers attend over 64 bytes (config.stages.window, in bytes on every attention path; the
byte layers' window), so stage 1 is a bottleneck: what lies further back reaches a byte's prediction
only through the main layers, which read one state per stage-1 chunk, and where stage-1 chunks end
then decides what the model can carry past 64 bytes. With full attention in the stage-1 layers
(window 0) they read every stage-0 chunk, and where stage-1 chunks end changes the loss only at
second order: stage 1 had nothing to learn from.

Expect (measured with this config pinned to one core with one XLA thread, `taskset -c 0 env
XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" python -m tokjax.train
--config configs/two_stage.py`, on a machine shared with other jobs, wall 40m55s; the log is
results/multistage/counterfactual/today.txt): 1.41M parameters, final val bpb 2.419 +- 0.070 (greedy
2.431) against the one-stage default's 2.377 and xz -9's 2.462, stage-0 rate 0.218 with chunks that
end on a word's last byte rather than its space (greedy whitespace recall 0.007, where the one-stage
model reaches 0.99: "wh|ich| only us|es| os| functions|."), and a stage 1 still unsure at this budget:
its greedy boundaries close 0.041 of the stage-0 chunks, its sampled ones fall near chance
(whitespace precision 0.067 against stage 0's 0.054). Other threading gives other floating-point
sums and so other runs (configs/default.py says how much that matters for the one-stage model).

Variants (stage 0 / stage 1):
  learned     policy / policy (the default)
  hnet        H-Net's router at both levels (its published two-stage form)
  whitespace  SpaceByte's rule, then the learned policy over its words
  stride      fixed stride at both levels (5 bytes, then 3 chunks)
Results at CPU scale, with the commands that made them: results/multistage/. At 1024-byte sequences
and 12M training bytes (`python -m tokjax.lab.multistage --seq_len 1024 ...`, there) stage 1 leaves
chance in three runs of four, weakly, and the model is 0.016 to 0.035 bpb behind one stage at equal
training FLOPs.
"""

from tokjax import config_defaults, config_files, presets

VARIANTS = {
    'learned': 'policy / policy: the score function at both levels',
    'hnet': "H-Net's router at both levels",
    'whitespace': 'whitespace rule, then the learned policy',
    'stride': 'fixed stride at both levels',
}
METHODS = {
    'learned': ('policy', 'policy'),
    'hnet': ('hnet', 'hnet'),
    'whitespace': ('whitespace', 'policy'),
    'stride': ('stride', 'stride'),
}


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'learned')
  c = config_defaults.base_config()
  first, second = METHODS[name]
  c.boundary.method = first
  c.model.stages = 2
  c.stages.update(
      method=(second,),
      target_rate=(0.33,),
      capacity=(256,),
      encoder_layers=(1,),
      decoder_layers=(1,),
  )
  # The budget at which stage 1 has something to learn (see the module docstring).
  c.data.update(corpus='shakespeare', seq_len=1024, batch_size=4)
  c.model.capacity = 512
  c.train.update(steps=2644, eval_every=500)
  if 'tiny' in options:
    presets.tiny(c)
    c.data.corpus = 'stdlib_docs'  # A smoke test needs no download.
    c.stages.capacity = (max(2, c.model.capacity // 2),)
  c.stages.window = (c.model.byte_window,)  # In bytes: see the module docstring.
  c.train.workdir = f'runs/two_stage_{name}'
  return c
