r"""The paper's main model: 147M parameters on FineWeb sample-100BT, score-function boundaries (w = 8).

  python -m tokjax.data.prepare hf:fineweb --out data/fineweb_147m --max_bytes 6600000000   # once
  python -m tokjax.train --config configs/paper_147m_fineweb.py   # then train (launch/README.md)
  (prepare needs `pip install -e .[hf]` and the hub; it wrote 5 GB of local text at 43 MB/s,
  results/data/README.md; from the hub the network bounds it. The folder may be a gs:// URL.)

d_model 768, 12 heads, encoder/main/decoder 4/12/4, sequence 4096 bytes, 128 sequences per step,
lr 1.5e-3 (warmup from 0.15e-3, cosine to 0), AdamW, bf16 compute, grad-clip 1.0, 6e9 training bytes
(11,444 steps), documents longer than 4096 bytes, target rate 0.2.
Expected result (paper, Dauncey & Wattenhofer 2026, Table 1; not reproduced here, which needs
accelerators): test bits-per-byte 1.297 with w = 8 (1.280 with w = 1, --config.boundary.policy.window=1),
learned rate 0.204. tokjax has not measured this configuration.
Slice: compiled ahead of time (python -m tokjax.compile_check, results/scale/README.md), it fits a v5p-8
(v5p:2x2x1: 77.1 of 95 GiB per chip) and a v4-32 (v4:2x2x4: 9.8 of 16 GiB per device) as it is; on v4:2x2x1 it needs --config.optim.grad_accum_steps=4 (14.2 of 16 GiB).
"""

from tokjax.config.presets import paper_config


def get_config():
  c = paper_config('147m')
  c.train.workdir = 'runs/paper_147m_fineweb'
  c.data.corpus = 'prepared:data/fineweb_147m'  # Written once by the prepare command above.
  return c
