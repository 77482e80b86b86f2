r"""The paper's 40M budget with two levels of learned boundaries (bytes -> chunks -> chunks of chunks).

  python -m tokjax.data.prepare hf:fineweb --out data/fineweb_40m --max_bytes 1650000000   # once
  python -m tokjax.train --config configs/paper_two_stage_40m.py   # then train (launch/)

configs/paper_40m_fineweb.py (d_model 512, 8 heads, sequence 4096, batch 64, 1.5e9 bytes, bf16, w = 8
policy at target rate 0.2 over bytes, 4 byte layers before and after) with its 6 main layers split as
in H-Net's two-stage model: stage 1 draws chunk ends over the stage-0 chunks with the same
score-function policy at target rate 0.5 (about 10 bytes per stage-1 chunk), with 2 layers over the
stage-0 chunks before it and 2 after, and 4 main layers run on the stage-1 chunks. Capacities are
1.25 x the expected chunk counts: 1024 stage-0 slots (819 expected), 512 stage-1 slots (410).
The stage-1 layers attend over 64 bytes, the byte layers' window (config.stages.window, in bytes), so
stage 1 is a bottleneck: only the main layers, one state per stage-1 chunk, read further back, and
where stage-1 chunks end decides what is carried past 64 bytes (with full attention in the stage-1
layers their decisions would change the loss only at second order).
Training FLOPs per byte at the target rates (model FLOPs, tokjax.flops.flops_per_byte):
124.4 MFLOPs for this config against 126.0 MFLOPs (-1.3%) for the one-stage paper config, measured with
  python -c "from tokjax import config_files as c, flops; a = c.load('paper_40m_fineweb'); \
      b = c.load('paper_two_stage_40m'); print(flops.flops_per_byte(a, (0.2,)), \
      flops.flops_per_byte(b, (0.2, 0.5)))"
Parameters: 48.8M against 40.3M for the one-stage config (the 4 stage-1 layers run on the stage-0
chunks, where the one-stage model runs its main layers, so equal FLOPs buy 2 more layers), counted
with jax.eval_shape of models.build_model(c).init (tokjax.lab.common.param_count).
Not run at scale: tokjax has neither trained nor compiled this config on accelerators.
"""

from tokjax.presets import paper_two_stage_config


def get_config():
  # The corpus folder is written once by the prepare command above.
  return paper_two_stage_config(
      '40m', main_layers=4, stage_layers=2, corpus='prepared:data/fineweb_40m'
  )
