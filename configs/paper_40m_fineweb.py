r"""The paper's ablation model: 40M parameters on FineWeb, the full method (w = 8).

  python -m tokjax.data.prepare hf:fineweb --out data/fineweb_40m --max_bytes 1650000000   # once
  python -m tokjax.train --config configs/paper_40m_fineweb.py   # then train (launch/)
  (prepare needs `pip install -e .[hf]` and the hub; it wrote 5 GB of local text at 43 MB/s,
  results/data/README.md; from the hub the network bounds it. The folder may be a gs:// URL.)

d_model 512, 8 heads, encoder/main/decoder 4/6/4, sequence 4096, batch 64, lr 2.4e-3, 1.5e9 bytes
(5,722 steps), bf16, target rate 0.2. The five ablations are configs/ablation_*.py, each this config
with one switch flipped.
Expected result (paper, ablation table, FineWeb validation): rate 0.196, 1.548 bits-per-byte, 0.99 of
whitespace bytes carrying a boundary. Not measured by tokjax.
Slice: compiled ahead of time (python -m tokjax.compile_check, results/scale/README.md), it fits a v5p-8
(v5p:2x2x1: 19.7 of 95 GiB per chip) and a v4-32 (v4:2x2x4: 2.6 of 16 GiB per device) as it is.
"""

from tokjax.config.presets import paper_config


def get_config():
  c = paper_config('40m')
  c.train.workdir = 'runs/paper_40m_fineweb'
  c.data.corpus = 'prepared:data/fineweb_40m'  # Written once by the prepare command above.
  return c
