"""The client end of the host API (:mod:`.protocol`).

Each call opens a connection to the daemon's API socket, sends one
request, waits for its reply and closes. A caller that cannot reach the
daemon gets :class:`~vmar_openstack.exception.ExportDaemonDown`; one the
daemon refuses gets :class:`~vmar_openstack.exception.HostApiDenied`;
every error the daemon raised on purpose comes back as its own class.
"""

import errno
import os
import socket
import time

from vmar_openstack import exception
from vmar_openstack.hostapi import protocol


def socket_path(conf):
    """The API socket as the daemon's own configuration names it.

    ``[vmar_host] api_socket``, by default ``api.sock`` beside the NBD
    socket: what ``vmar-export serve`` listens on, and what the
    ``vmar-export`` commands, reading the same file, call.
    """
    c = conf.vmar_host
    return c.api_socket or os.path.join(os.path.dirname(c.export_socket),
                                        'api.sock')


class Client:
    """Calls of the export daemon on ``path``.

    ``timeout``: seconds a call may take, the daemon's work included (an
    ``add`` whose map is still being made waits for it on the daemon's
    side, up to its own bound).
    """

    def __init__(self, path, timeout=360):
        self.path = path
        self.timeout = timeout
        self._hello = None

    def nbd_socket(self):
        """The daemon's NBD socket (``hello``, asked once per client)."""
        return self._hello_once()['nbd_socket']

    def guest_channel_dir(self):
        """Where QEMU binds guest channels (``hello``); None: no channels.

        None too from a daemon of before the channels.
        """
        return self._hello_once().get('guest_channel_dir')

    def _hello_once(self):
        if self._hello is None:
            self._hello = self.hello()
        return self._hello

    @classmethod
    def from_host_conf(cls, conf):
        """The client of the daemon the daemon's own file describes."""
        return cls(socket_path(conf))

    @classmethod
    def from_compute_conf(cls, conf):
        """The client of this host's daemon, as nova.conf names it."""
        c = conf.vmar_compute
        return cls(c.api_socket, c.api_timeout)

    def call(self, op, **args):
        """The result of ``op`` with keyword arguments ``args``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            try:
                self._connect(sock)
            except FileNotFoundError as e:
                raise exception.ExportDaemonDown(
                    reason='no API socket %s: %s' % (self.path, e.strerror))
            except PermissionError as e:
                raise exception.HostApiDenied(
                    reason='%s: %s (the caller must be root or in the '
                    'socket\'s group)' % (self.path, e.strerror))
            except OSError as e:
                if e.errno in (errno.ECONNREFUSED, errno.ENOTSOCK):
                    raise exception.ExportDaemonDown(
                        reason='%s: %s' % (self.path, e.strerror))
                raise exception.HostApiError(reason='%s: %s'
                                             % (self.path, e))
            reply = self._exchange(sock, protocol.request(op, args))
        finally:
            sock.close()
        if 'error' in reply:
            protocol.raise_error(reply['error'])
        if 'result' not in reply:
            raise exception.HostApiError(reason='a reply without result')
        return reply['result']

    def _connect(self, sock):
        """Connect, waiting while the daemon's backlog is full."""
        deadline = time.monotonic() + self.timeout
        delay = 0.01
        while True:
            try:
                return sock.connect(self.path)
            except BlockingIOError:
                if time.monotonic() + delay > deadline:
                    raise exception.HostApiError(
                        reason='%s: the daemon accepted no connection '
                        'within %s s' % (self.path, self.timeout))
                time.sleep(delay)
                delay = min(0.5, delay * 2)

    def _exchange(self, sock, message):
        try:
            try:
                sock.sendall(protocol.encode(message))
            except BrokenPipeError:
                pass    # refused: the reason waits to be read
            line = sock.makefile('rb').readline(protocol.MAX_LINE + 1)
        except socket.timeout:
            raise exception.HostApiError(
                reason='no reply to %s within %s s' % (message['op'],
                                                       self.timeout))
        except OSError as e:
            raise exception.HostApiError(reason='%s: %s' % (self.path, e))
        if not line:
            raise exception.HostApiError(
                reason='the daemon closed the connection without a reply '
                'to %s' % message['op'])
        return protocol.decode(line)

    # one method per operation
    def hello(self):
        return self.call('hello')

    def add(self, image_id, host_cache='base', holder='cli', version=None,
            key=None, whole=False):
        """Reference an export for ``holder``; it is served on return.

        Returns the export (``protocol`` doc) with the holder's ``uri``
        and the image's ``virtual_size``.
        """
        return self.call('add', image_id=image_id, host_cache=host_cache,
                         holder=holder, version=version, key=key,
                         whole=whole)

    def remove(self, image_id, holder='cli', version=None):
        return self.call('remove', image_id=image_id, holder=holder,
                         version=version)

    def release(self, holder):
        return self.call('release', holder=holder)

    def holders(self):
        return self.call('holders')

    def list(self):
        return self.call('list')

    def status(self):
        return self.call('status')

    def digests(self, image_id, version):
        """The path of ``image_id``'s digest list on this host.

        ``version``: a map version of the image the host holds (a
        server's pinned one).
        """
        return self.call('digests', image_id=image_id,
                         version=version)['path']

    def health(self, names=()):
        """Whether the daemon is up, and which of ``names`` it serves."""
        return self.call('health', names=sorted(names))
