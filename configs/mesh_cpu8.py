r"""The score-function method trained sharded on 8 simulated CPU devices: data=2, fsdp=2, tensor=2.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tokjax.train --config configs/mesh_cpu8.py

(or launch/local_cpu.sh, which sets the flag). The batch of 16 sequences is split over data x fsdp
(4 rows per shard, each shard on a pair of tensor devices), parameters and Adam moments are sharded over fsdp (the `embed` axis) and
tensor (heads, MLP width, vocabulary), so each device holds about a quarter of the state. The numbers
are the single-device ones to float round-off (tests/test_sharding.py checks 1e-5); this config is
the quick end-to-end check that a sharded run trains, evaluates and checkpoints from one command.
Hierarchical model, d_model 64, 4 heads, 1/1/1 blocks, L = 128, 200 steps on the standard library.
Expect (1m24s on one core of a loaded machine): 0.17M parameters, mesh
{'data': 2, 'fsdp': 2, 'tensor': 2}, final val bpb 3.52 (gzip -9 1.995, xz -9 1.681), rate 0.22.
The run is far too short to learn boundaries (whitespace recall stays at chance, 0.22); it checks the
plumbing. `--resume` continues it on any other mesh shape, e.g. --config.mesh.fsdp=8
--config.mesh.data=1 --config.mesh.tensor=1 --config.train.steps=225.
"""

from tokjax.config.defaults import base_config


def get_config():
  c = base_config()
  c.model.update(
      d_model=64,
      num_heads=4,
      encoder_layers=1,
      main_layers=1,
      decoder_layers=1,
      byte_window=32,
      capacity=64,
  )
  c.data.update(seq_len=128, batch_size=16)
  c.eval.update(batch_size=16, max_batches=4)
  c.train.update(
      steps=200, log_every=25, eval_every=100, checkpoint_every=100, workdir='runs/mesh_cpu8'
  )
  c.optim.warmup_steps = 20
  c.mesh.update(data=2, fsdp=2, tensor=2)
  return c
