r"""The planted two-level check: does a learned stage 1 end its chunks at phrase ends? (CPU size.)

  python -m tokjax.lab.synthetic --design phrases --steps 1500 --eval_every 500 --eval_docs 128 \
      --out results/synthetic/phrase_ends/prefix_book_learned/seed0
  python -m tokjax.lab.synthetic --design phrases --words --steps 600 --eval_every 200 \
      --eval_docs 128 --seed S --out results/synthetic/phrase_ends/prefix_book_words/seedS

Once that command has written its corpus, one run alone trains with
  python -m tokjax.train --config configs/synthetic_two_stage.py:learned \
      --config.data.corpus=runs/synthetic_phrases/corpus

Corpus (tokjax/lab/synthetic.py, `PhraseSpec`): lexicon words closed by a space, in phrases of a
fixed phrase book, each phrase closed by ',' or '.', and blocks of phrases each followed by an exact
copy at a distance of more than the stage-1 window. The book holds every stem at every length, so
a phrase's end shows only at its mark (`--book distinct`: the book of the results before
results/synthetic/phrase_ends/).
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
Measured (128 held-out documents; results/synthetic/phrase_ends/, where the tables and the
commands are):
- Both stages learned, 1500 steps (the first command; 177-220 s a run on one core), seeds 0-3: at
  seeds 0, 2 and 3 the learned stage 1 ends its chunks at phrase ends, greedy precision 0.982,
  0.921 and 0.930 against a chance of 0.317, 0.297 and 0.291. It beats the uniform control by 50.1,
  38.3 and 40.0 standard errors greedy (16.1, 26.6 and 31.8 sampled) and no_rl by 16.8, 23.6 and
  34.5 sampled. At seeds 2 and 3 it lowers bpb by 0.031 +- 0.003 and 0.042 +- 0.003 against
  uniform. At seed 1 stage 0 did not learn words (its ends at spaces: 0.18), so no end can reach a
  phrase end.
- With the words given (600 steps, 83-110 s a run), the learned stage 1 keys on phrase ends at every
  seed, but on one of two opposite sides: at seeds 1 and 4 of 0-7 it ends its chunks there (greedy
  precision 0.870 and 1.000 against a chance of 0.325 and 0.323; above the uniform control by 37.6
  and 47.7 standard errors greedy, 12.7 and 8.5 sampled, and above no_rl by 21.8 and 21.4 sampled).
  At the other six it avoids them (boundary probability 0.00-0.16 at phrase ends against
  0.47-0.56 at the other word ends). Learned minus uniform bpb lies between -0.017 and +0.009 on
  both sides: the loss does not pick the side, the seed does (seed 1 takes the phrase ends, seed 0
  the other side, on every corpus tried: this one, sentence marks and successor order).
- The earlier book (`--book distinct`; results/synthetic/phrases_words/) let the words before a
  phrase's last word foretell its end, and five of six learning seeds closed phrases one word early.
- With stage 0 learned too on the earlier book (results/synthetic/phrases_1500/), stage 1 closed
  phrases one word early where stage 0 took the space side.

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
