"""A TCP proxy in front of a service: outages and hangs on demand."""

import os
import signal
import time

from tools.vmarenv import process


class TcpProxy(process.Service):
    """socat forwarding 127.0.0.1:``port`` to ``target``.

    Stopped, it is an outage (connection refused); start() heals it.
    Paused, it is a store that hangs; resume() heals it.
    """

    name = 'tcp-proxy'

    def __init__(self, target_host, target_port, work_dir=None):
        super().__init__(work_dir)
        self.target = (target_host, int(target_port))
        self.port = process.free_port()

    @property
    def url(self):
        return 'http://127.0.0.1:%d' % self.port

    def log_files(self):
        return [os.path.join(self.work_dir, 'socat.log')]

    def start(self):
        self._spawn(['socat', 'TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork'
                     % self.port, 'TCP:%s:%d' % self.target],
                    self._env(), self.log_files()[0])
        deadline = time.time() + 10
        while not process.port_open(self.port):
            if self.proc.poll() is not None or time.time() > deadline:
                self._fail('socat does not listen on %d' % self.port)
            time.sleep(0.05)

    def stop(self):
        self._kill_all()

    def pause(self):
        """A store that takes connections and never answers (SIGSTOP)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)
