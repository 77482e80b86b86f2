r"""The paper's 147M budget with two levels of learned boundaries (bytes -> chunks -> chunks of chunks).

  python -m tokjax.data.prepare hf:fineweb --out data/fineweb_147m --max_bytes 6600000000   # once
  python -m tokjax.train --config configs/paper_two_stage_147m.py   # then train (launch/README.md)

configs/paper_147m_fineweb.py with its 12 main layers split as in H-Net's two-stage model: stage 1
draws ends over the stage-0 chunks (policy at target rate 0.5) with 4 layers before and 4 after it,
and 8 main layers over the stage-1 chunks; capacities 1.25 x the expected chunk counts (1024, 512);
stage-1 layers attend over 64 bytes. Cost: 344.1 MFLOPs per training byte against 350.2 for the
one-stage config (-1.8%; `tokjax.flops.flops_per_byte(config, (0.2, 0.5))`), 184.9M parameters
against 146.9M (`tokjax.lab.common.param_count`).
Expect: not run at scale; tokjax has neither trained nor compiled this config on accelerators.
"""

from tokjax.config.presets import paper_two_stage_config


def get_config():
  # The corpus folder is written once by the prepare command above.
  return paper_two_stage_config(
      '147m', main_layers=8, stage_layers=4, corpus='prepared:data/fineweb_147m'
  )
