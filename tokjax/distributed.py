"""Multi-host start-up: `maybe_initialize` joins the JAX distributed system when several processes run.

Every process of a multi-host job runs the same command (launch/ holds scripts for TPU pods, GPU nodes
and SLURM). Before any JAX computation each process must call `jax.distributed.initialize()`, which
finds the coordinator, the process count and this process's index from the environment:

  config.mesh.multihost = 'auto'  (default) initialize when the environment shows several
      processes: JAX_COORDINATOR_ADDRESS is set (JAX_NUM_PROCESSES and JAX_PROCESS_ID then give the
      count and this process's index), an srun step runs more than one task
      (SLURM_STEP_NUM_TASKS > 1), Open MPI runs more than one rank (OMPI_COMM_WORLD_SIZE > 1), or
      TPU_WORKER_HOSTNAMES lists more than one worker.
  config.mesh.multihost = 'on'    always initialize (jax finds Cloud TPU pods, SLURM and Open MPI
      jobs itself); launch/tpu_pod.sh passes this.
  config.mesh.multihost = 'off'   never: one process drives all local devices.

A single multi-GPU node or a single TPU VM needs no initialization: one process sees every device.
"""

import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from tokjax.errors import UserError

CHOICES = ('auto', 'on', 'off')


def detect_multihost(environ=None) -> bool:
  """Whether the environment describes a job of several processes (see the module docstring)."""
  env = os.environ if environ is None else environ
  get_int = lambda name: int(env[name]) if env.get(name, '').isdigit() else 0
  if env.get('JAX_COORDINATOR_ADDRESS'):
    return True
  # SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: the batch script itself is one process even when the
  # allocation has many tasks; only an `srun` step runs several.
  if 'SLURM_JOB_ID' in env and get_int('SLURM_STEP_NUM_TASKS') > 1:
    return True
  if get_int('OMPI_COMM_WORLD_SIZE') > 1:
    return True
  hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h.strip()]
  return len(hosts) > 1


def _initialize_kwargs(environ=None) -> dict:
  """Explicit arguments when JAX_COORDINATOR_ADDRESS is used (jax reads the address itself)."""
  env = os.environ if environ is None else environ
  if not env.get('JAX_COORDINATOR_ADDRESS'):
    return {}
  kwargs = {}
  for key, name in (('num_processes', 'JAX_NUM_PROCESSES'), ('process_id', 'JAX_PROCESS_ID')):
    value = env.get(name, '')
    if not value.isdigit():
      raise UserError(
          f'JAX_COORDINATOR_ADDRESS is set but {name}={value!r} is not a number; set '
          'JAX_NUM_PROCESSES (processes in the job) and JAX_PROCESS_ID (0..N-1) too.'
      )
    kwargs[key] = int(value)
  return kwargs


def maybe_initialize(mode: str = 'auto') -> bool:
  """Calls `jax.distributed.initialize()` once when `mode` (config.mesh.multihost) asks for it.

  Must run before anything touches JAX devices. Returns True when this process is now part of a
  multi-process job (also when it already was).
  """
  if mode not in CHOICES:
    raise UserError(f'config.mesh.multihost={mode!r} is not valid; use one of {CHOICES}.')
  if jax.distributed.is_initialized():
    return True
  if mode == 'off' or (mode == 'auto' and not detect_multihost()):
    return False
  try:
    jax.distributed.initialize(**_initialize_kwargs())
  except (RuntimeError, ValueError) as e:
    raise UserError(
        f'jax.distributed.initialize() failed ({str(e).splitlines()[0][:200]}); on one '
        'host use --config.mesh.multihost=off, on several check the launcher '
        '(see launch/README.md).'
    ) from None
  connect_collectives()
  return True


def connect_collectives() -> None:
  """Runs one collective over every device while the processes are in step (just after joining).

  On CPU, jax's cross-process collectives go through gloo, whose first collective on a set of devices
  connects the processes and fails ('Gloo context initialization failed ... GetKeyValue() timed out'
  or 'Connect timeout') unless every process arrives within gloo's fixed 30 s; later collectives on
  the same devices reuse that connection and wait as long as XLA lets them (30 minutes). Without this,
  the train step's first all-reduce would connect, and processes whose compilations end more than
  30 s apart (a loaded machine, a slower host) would fail. Elsewhere it is a cheap barrier.
  """
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('all',))
  ones = jax.make_array_from_callback(
      (jax.device_count(),), NamedSharding(mesh, P('all')), lambda index: np.ones(1, np.int32)
  )
  total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(ones)
  if int(total) != jax.device_count():
    raise RuntimeError(f'a sum over {jax.device_count()} devices gave {int(total)}')
