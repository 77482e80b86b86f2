r"""A tokjax run out of JAX: safetensors and a PyTorch / transformers model with the same logits.

  python -m tokjax.export --checkpoint RUN --out DIR [--step N]
  python -m tokjax.export --import DIR --out RUN

The export folder loads with `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`:
model.safetensors (PyTorch layout), config.json, configuration_tokjax.py and modeling_tokjax.py
(PyTorch only, no JAX), a byte tokenizer, generation_config.json and a model card. Before anything
is written, tokjax and the PyTorch model run on the same bytes, and the export is refused unless
their logits agree within 1e-4 in float32 with given boundaries and their greedy boundaries agree
exactly. `--import` turns such a folder back into a run that evaluates to the same bpb and resumes
training (fresh optimizer state). Modules: `exporter` (the folder and the gate), `importer` (the
way back), `mapping` (parameter names and layouts), `spec` (the config as config.json fields),
`tokenizer`. Needs the optional extra: pip install -e '.[export]'. See docs/export.md.
"""
