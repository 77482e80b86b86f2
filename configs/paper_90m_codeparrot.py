r"""The paper's code model: 90M parameters on CodeParrot (documents >= 4096 bytes), score function.

  python -m tokjax.data.prepare hf:codeparrot --out data/codeparrot --max_bytes 3740000000  # once
  python -m tokjax.train --config configs/paper_90m_codeparrot.py   # then train (launch/)
  (prepare needs `pip install -e .[hf]` and the hub; it wrote 5 GB of local text at 43 MB/s,
  results/data/README.md; from the hub the network bounds it. The folder may be a gs:// URL.)

d_model 768, 12 heads, encoder/main/decoder 4/6/4, sequence 4096, batch 128, lr 2e-3, 3.4e9 bytes
(6,484 steps), bf16, w = 8, target rate 0.2.
Expected result (paper): validation loss 0.568 (H-Net routing: 0.769). Not measured by tokjax.
Slice: compiled ahead of time (python -m tokjax.compile_check, results/scale/README.md), it fits a v5p-8
(v5p:2x2x1: 58.6 of 95 GiB per chip) and a v4-32 (v4:2x2x4: 7.6 of 16 GiB per device) as it is.
"""

from tokjax.config.presets import paper_config


def get_config():
  c = paper_config('90m')
  c.train.workdir = 'runs/paper_90m_codeparrot'
  c.data.corpus = 'prepared:data/codeparrot'  # Written once by the prepare command above.
  return c
