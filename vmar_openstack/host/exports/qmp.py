"""A synchronous QMP client of the export daemon.

:class:`Monitor` wraps the ``qemu.qmp`` library's asyncio client in a
private event loop. It is the one way the export service talks to
``qemu-storage-daemon``, and a context manager: the connection is closed
when the block ends, however it ends::

    with qmp.Monitor(path) as mon:
        mon.execute('query-block-exports')
"""

import asyncio
import contextlib

from qemu.qmp import QMPClient
from qemu.qmp import QMPError

from vmar_openstack import exception


class Monitor:
    """A synchronous face on ``qemu.qmp.QMPClient``.

    :raises ExportDaemonDown: when nobody answers QMP on ``path`` within
        ``timeout`` seconds.
    """

    def __init__(self, path, timeout=30):
        self.path = path
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._qmp = QMPClient('vmar-export')
        try:
            self._run(self._qmp.connect(path))
        except (OSError, asyncio.TimeoutError, QMPError) as e:
            self._loop.close()
            raise exception.ExportDaemonDown(reason=e)

    def _run(self, coro):
        return self._loop.run_until_complete(
            asyncio.wait_for(coro, self.timeout))

    def execute(self, cmd, args=None):
        try:
            return self._run(self._qmp.execute(cmd, args or {}))
        except QMPError as e:
            raise exception.ExportError('%s failed: %s' % (cmd, e))

    def close(self):
        with contextlib.suppress(Exception):
            self._run(self._qmp.disconnect())
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
