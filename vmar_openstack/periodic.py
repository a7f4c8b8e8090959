"""A thread of ``vmar-export serve`` that does one step per interval.

The guest channels (:mod:`.guests`), the warm metadata (:mod:`.warm`),
the peer discovery (:mod:`.discovery`) and the host's reports
(:mod:`.report`) each run one: :meth:`Periodic.step` every ``interval``
seconds, sooner when :meth:`Periodic.wake` is called (``settle`` seconds
after the wake, so that the wakes meanwhile make one step), and a failed
step is logged, not fatal. :meth:`Periodic.stop` joins the thread, then calls
:meth:`Periodic.close`.
"""

import threading

from oslo_log import log as logging

LOG = logging.getLogger(__name__)


class Periodic:

    #: the thread's name, and what a failed step is logged as
    name = 'vmar-periodic'

    def __init__(self, interval, settle=0.0):
        self.interval = interval
        self.settle = settle
        self.stopping = threading.Event()
        self.woken = threading.Event()
        self.thread = None

    def step(self):
        raise NotImplementedError

    def close(self):
        """What is left to release once the thread has stopped."""

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=self.name)
        self.thread.start()
        return self

    def wake(self):
        """Do a step now rather than at the end of the interval."""
        self.woken.set()

    def _run(self):
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception:
                LOG.exception('%s: step failed', self.name)
            if self.woken.wait(self.interval) and self.settle:
                # stop() wakes too, and does not wait
                self.stopping.wait(self.settle)
            self.woken.clear()

    def stop(self):
        self.stopping.set()
        self.woken.set()
        if self.thread is not None:
            self.thread.join()
        self.close()
