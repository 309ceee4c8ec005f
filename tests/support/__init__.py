"""Shared test harness, in one place; no test module imports another.

* ``procs``      real OS processes: workers with a gloo process group, torchrun, commands; hard
                 timeouts, no orphans (``worker`` is the process entry point)
* ``inprocess``  K ranks in one process over ``geodml.comm.InProcessGroup``; ZeroMQ transport groups
* ``files``      dataset files in the real formats (IDX, CIFAR-10) and run/study directories
* ``monitoring`` the Grafana dashboard's expressions, a small PromQL scanner, free port ranges
* ``browser``, ``debpkg``  headless Chromium over a pipe; Debian packages the tests install
"""
