r"""The paper's 40M budget with two levels of learned boundaries (bytes -> chunks -> chunks of chunks).

  python -m tokjax.data.prepare hf:fineweb --out data/fineweb_40m --max_bytes 1650000000   # once
  python -m tokjax.train --config configs/paper_two_stage_40m.py   # then train (launch/)

configs/paper_40m_fineweb.py with its 6 main layers split as in H-Net's two-stage model: stage 1
draws ends over the stage-0 chunks (policy at target rate 0.5) with 2 layers before and 2 after it,
and 4 main layers over the stage-1 chunks; capacities 1.25 x the expected chunk counts (1024, 512);
stage-1 layers attend over 64 bytes. Cost: 124.4 MFLOPs per training byte against 126.0 for the
one-stage config (-1.3%; `tokjax.flops.flops_per_byte(config, (0.2, 0.5))`), 48.8M parameters
against 40.3M (`tokjax.lab.common.param_count`).
Expect: not run at scale; tokjax has neither trained nor compiled this config on accelerators.
"""

from tokjax.config.presets import paper_two_stage_config


def get_config():
  # The corpus folder is written once by the prepare command above.
  return paper_two_stage_config(
      '40m', main_layers=4, stage_layers=2, corpus='prepared:data/fineweb_40m'
  )
