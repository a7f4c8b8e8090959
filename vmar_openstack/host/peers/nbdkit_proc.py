"""The nbdkit servers ``vmar-export serve`` runs, started until ready.

The range server (:meth:`.supervisor.Supervisor.start_fetcher`) and the
peer server (:func:`.peers.start`): each is ready once a file appears
(its unix socket, its pid file), and each logs to a file of its own under
``host_dir``.
"""

import contextlib
import os
import subprocess
import time

from vmar_openstack import exception


def start(cmd, env, log_path, ready_path, what, timeout=60):
    """Run ``cmd`` until ``ready_path`` exists; its process.

    :raises ExportError: it exited first, or did not get ready in
        ``timeout`` seconds (then it is killed).
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(ready_path)
    with open(log_path, 'ab') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready_path):
        if proc.poll() is not None:
            raise exception.ExportError('%s exited with %d; see %s'
                                        % (what, proc.returncode, log_path))
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise exception.ExportError('%s did not start; see %s'
                                        % (what, log_path))
        time.sleep(0.05)
    return proc
