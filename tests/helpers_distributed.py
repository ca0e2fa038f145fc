"""Child processes of the multi-process tests (torchrun, accelerate's
launch by hand): an environment that imports this checkout's fastloader
and meets on this host, a free port, and a 2-rank torchrun."""
import os
import socket
import subprocess
import sys

import fastloader


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(*path, **extra):
    """os.environ plus the folder above fastloader and `path` on PYTHONPATH,
    torch.distributed's rendezvous on 127.0.0.1, one OpenMP thread (the
    ranks share the CPUs), and `extra`."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fastloader.__file__)))
    return dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([pkg_parent, *path, os.environ.get("PYTHONPATH", "")]), **extra)


def torchrun(script, *args, timeout, path=()):
    """`script args` on 2 ranks under torch.distributed.run; fails the test
    with the tails of its output unless it exits 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), *map(str, args)]
    proc = subprocess.run(cmd, env=child_env(*path), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
