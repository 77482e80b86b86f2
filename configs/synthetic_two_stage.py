r"""The planted two-level check: does a learned stage 1 end its chunks at phrase ends? (CPU size.)

  python -m tokjax.lab.synthetic --design phrases --out results/synthetic/phrases

Once that command has written its corpus, one run alone trains with
  python -m tokjax.train --config configs/synthetic_two_stage.py:learned \
      --config.data.corpus=runs/synthetic_phrases/corpus

Corpus (tokjax/lab/synthetic.py, `PhraseSpec`): lexicon words closed by a space, in phrases of a
fixed phrase book, each phrase closed by ',' or '.', and blocks of phrases each followed by an exact
copy at a distance of more than the stage-1 window.
Model: configs/synthetic_cpu.py's (d_model 64, byte window 8, L = 128, B = 16) with a second stage
(target rate 0.33 per stage-0 chunk, one layer before and one after it, capacity 32) whose layers
attend over 32 bytes (config.stages.window): what lies further back -- the first copy of a block --
reaches a byte's prediction only through the main layers, which read one state per stage-1 chunk.
So where stage-1 chunks end decides what the main layers can match between the two copies: a
stage-1 chunk that is one whole phrase is the same chunk in both.

':tiny' after a variant shrinks it to smoke-test size (`presets.tiny`; the experiment's --tiny).

Variants (the experiment's runs; stage 0 is the learned policy in all of them):
  learned   stage 1 learned by the score function (the method under test)
  uniform   stage 1 the 'uniform' rival: its chunk ends picked at random among stage-0 chunk ends
  no_rl     stage 1 learned with config.stages.lambda_rl = 0: no policy gradient at stage 1, only the
            rate loss
Measured (600 steps, 128 held-out documents; results/synthetic/phrases/ and phrases_seed1/): seed 0,
sampled boundaries: the learned stage 1 ends 0.339 +- 0.013 of its chunks at phrase ends against a
chance of 0.280 +- 0.005, while no_rl (0.263) and uniform (0.259) sit at theirs (learned minus
control +0.076 +- 0.014 and +0.080 +- 0.018, paired over documents); seed 1: the learned stage 1 sits
at chance (0.222 +- 0.013 against 0.218). Greedy stage-1 boundaries close no chunk in any learned
run, and bpb is the same in all runs of a seed (within 0.002).

Each variant is this file's base config with `OVERRIDES[name]` applied (dotted config paths), so a
new setting for one variant (an estimator of stage 1, say) is one more entry there.
"""

from tokjax import config_files, presets

VARIANTS = {
    'learned': 'stage 1 learned by the score function',
    'uniform': "stage 1 the 'uniform' rival (random ends among stage-0 chunk ends)",
    'no_rl': 'stage 1 with config.stages.lambda_rl = 0 (the rate loss only)',
}
OVERRIDES = {
    'learned': {},
    'uniform': {'stages.method': ('uniform',)},
    'no_rl': {'stages.lambda_rl': (0.0,)},
}
STAGE1_WINDOW = 32  # Bytes; the corpus' copies lie further back than this.


def get_config(arg=None):
  name, options = config_files.parse_variant(arg, VARIANTS, 'learned')
  c = config_files.load('synthetic_cpu', 'method')
  c.model.stages = 2
  c.stages.update(
      method=('policy',),
      target_rate=(0.33,),
      capacity=(32,),
      encoder_layers=(1,),
      decoder_layers=(1,),
      window=(STAGE1_WINDOW,),
  )
  if 'tiny' in options:
    presets.tiny(c)
    c.stages.capacity = (16,)
  config_files.set_fields(c, OVERRIDES[name])
  c.train.workdir = f'runs/synthetic_phrases/{name}'
  return c
