r"""The planted two-level check: does a learned stage 1 end its chunks at phrase ends? (CPU size.)

  python -m tokjax.lab.synthetic --design phrases --steps 600 --eval_every 200 --eval_docs 128 \
      --out results/synthetic/phrases
  python -m tokjax.lab.synthetic --design phrases --words --steps 600 --eval_every 200 \
      --eval_docs 128 --seed S --out results/synthetic/phrases_words/seedS   # the words given

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
',words' makes stage 0 the whitespace rule (the words given; the experiment's --words): the variants
then differ in stage 1 alone, and stage 1's chance level is the same in all of them. With a learned
stage 0, which side of the space its chunks end on is settled by the seed, and with it what a stage-1
end can hit.

Variants (the experiment's runs; stage 0 is the learned policy in all of them):
  learned   stage 1 learned by the score function (the method under test)
  uniform   stage 1 the 'uniform' rival: its chunk ends picked at random among stage-0 chunk ends
  no_rl     stage 1 learned with config.stages.lambda_rl = 0: no policy gradient at stage 1, only the
            rate loss
Measured (600 steps, 128 held-out documents, about 2 minutes a run on one core):
- With the words given (`--words`; results/synthetic/phrases_words/, seeds 0-7), the learned stage 1
  ends its chunks on one side of the phrase end far above chance at six seeds of eight. Seed 1 ends
  them at phrase ends: greedy precision 0.911 against a chance of 0.362, sampled 0.572. Seeds 0, 2,
  5, 6 and 7 end them one word before: greedy 0.47-0.68 against 0.31-0.36. At these six seeds the
  learned stage 1 beats both controls by 6.4 to 29.9 standard errors (paired over documents). Seed 4
  is in between, and at seed 3 stage 1 is still at chance.
- With stage 0 learned too (results/synthetic/phrases/ and phrases_seed1/), the result follows the
  side of the space stage 0 settled on. At seed 0, sampled boundaries: 0.339 +- 0.013 at phrase ends
  against a chance of 0.280 +- 0.005, the controls at chance. At seed 1, where stage 0's chunks end
  before the spaces, stage 1 is at chance (0.222 +- 0.013 against 0.218), and greedy it ends no chunk.

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
  name, options = config_files.parse_variant(arg, VARIANTS, 'learned', ('tiny', 'words'))
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
  if 'words' in options:
    c.boundary.method = 'whitespace'
  config_files.set_fields(c, OVERRIDES[name])
  c.train.workdir = f'runs/synthetic_phrases/{name}'
  return c
