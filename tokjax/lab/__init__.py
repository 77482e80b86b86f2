"""The lab: experiments, measurements and fault tools built on the library; they write results/.

The library (everything in tokjax/ outside this package) never imports the lab; setup.cfg's
import-linter contracts check it in CI. Each module is a command:

  python -m tokjax.lab.compare              every boundary method at one equal budget
  python -m tokjax.lab.ladder               every method over growing byte budgets, paired statistics
  python -m tokjax.lab.multistage           one stage against two, learned and H-Net
  python -m tokjax.lab.synthetic            boundaries on planted segments
  python -m tokjax.lab.estimators           bias and variance of boundary-gradient estimators
  python -m tokjax.lab.estimator_training   estimators compared over whole training runs
  python -m tokjax.lab.chaos                kill -9 / SIGTERM fault injection against exact resume
  python -m tokjax.lab.benchmarks.{throughput,scaling,prepared_data}

What the experiments share (train or load a run, evaluate it, write its results table and plot)
is tokjax.lab.common.
"""
