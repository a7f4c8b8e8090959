"""The host API's server, inside ``vmar-export serve``.

A threaded unix-socket server (:mod:`socketserver`): each connection gets a
thread, so a spawn that waits for its map does not hold up a delete. Every
operation is an :class:`~.service.ExportService` call, and the service is
the daemon's own: nobody else changes the host's state.

The socket is made under a temporary name, given to root and
``[vmar_host] api_socket_group`` with mode 0660, then renamed into place.
Each connection's peer is checked again from its credentials
(``SO_PEERCRED``): root, the daemon's own user, or a member of the group;
anybody else is answered ``HostApiDenied`` and hung up on (the mode is
the first gate; this one holds when the directory's permissions or a
copied socket let others connect).
"""

import contextlib
import dataclasses
import grp
import os
import socket
import socketserver
import threading

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.observe import status as export_status
from vmar_openstack.hostapi import client
from vmar_openstack.hostapi import protocol

LOG = logging.getLogger(__name__)


def export_view(exp):
    """An export record as the API shows it: without the holders' keys."""
    out = dataclasses.asdict(exp)
    out.pop('keys')
    out['name'] = exp.name
    out['targets'] = [list(t) for t in exp.targets]
    return out


# -- the operations: (service, args) -> a JSON value -------------------

def _hello(svc, args):
    return {'versions': list(protocol.VERSIONS), 'pid': os.getpid(),
            'nbd_socket': svc.socket,
            'guest_channel_dir': (svc.guests.dir if svc.guests else None)}


def _add(svc, args):
    holder = args.get('holder') or 'cli'
    svc.wait_ready()
    exp = svc.add(args['image_id'], host_cache=args.get('host_cache',
                                                        'base'),
                  holder=holder, version=args.get('version'),
                  key=args.get('key'), whole=bool(args.get('whole')))
    out = export_view(exp)
    out['uri'] = svc.uri(exp, holder)
    out['virtual_size'] = svc.virtual_size(exp)
    return out


def _remove(svc, args):
    left = svc.remove(args['image_id'], holder=args.get('holder') or 'cli',
                      version=args.get('version'))
    return [export_view(e) for e in left]


def _release(svc, args):
    return svc.release(args['holder'])


def _holders(svc, args):
    return svc.holders()


def _list(svc, args):
    exports, live = svc.list()
    out = []
    for _n, e in sorted(exports.items()):
        view = export_view(e)
        view['state'] = ('down' if live is None else 'up' if e.served(live)
                         else 'missing')
        out.append(view)
    return {'exports': out, 'daemon_up': live is not None}


def _status(svc, args):
    return export_status.collect(svc).as_dict()


def _health(svc, args):
    # only of the names asked about: NBD names carry their holders' keys
    _exports, live = svc.list()
    asked = set(args.get('names') or ())
    return {'daemon_up': live is not None,
            'served': sorted(asked & (live or set()))}


def _digests(svc, args):
    return {'path': svc.digest_list(args['image_id'], args['version'])}


OPS = {'hello': _hello, 'add': _add, 'remove': _remove,
       'release': _release, 'holders': _holders, 'list': _list,
       'status': _status, 'health': _health, 'digests': _digests}
assert set(OPS) == set(protocol.OPS)


def _groups(pid):
    """Supplementary groups of a process (empty if it is gone)."""
    try:
        with open('/proc/%d/status' % pid) as f:
            for line in f:
                if line.startswith('Groups:'):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


class _Handler(socketserver.StreamRequestHandler):

    def handle(self):
        server = self.server
        pid, uid, gid = fileutils.socket_peer(self.request)
        why = server.refused(pid, uid, gid)
        if why:
            LOG.warning('host API: refused pid %d uid %d: %s', pid, uid,
                        why)
            self._send(protocol.error_reply(exception.HostApiDenied(
                reason=why)))
            return
        while True:
            line = self.rfile.readline(protocol.MAX_LINE + 1)
            if not line:
                return
            try:
                req = protocol.decode(line)
                self._send(protocol.reply(server.dispatch(req)))
            except exception.VmarException as e:
                self._send(protocol.error_reply(e))
            except (KeyError, TypeError, ValueError) as e:
                self._send(protocol.error_reply(exception.HostApiError(
                    reason='bad arguments: %s' % e)))
            except Exception as e:
                LOG.exception('host API: %r failed', line[:200])
                self._send(protocol.error_reply(exception.ExportError(
                    reason='internal error: %s' % e)))

    def _send(self, message):
        with contextlib.suppress(OSError):
            self.wfile.write(protocol.encode(message))
            self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    # every nova-compute worker may call at once (a boot storm)
    request_queue_size = socket.SOMAXCONN

    def __init__(self, path, service, gid):
        self.service = service
        self.gid = gid
        super().__init__(path, _Handler)

    def refused(self, pid, uid, gid):
        """Why a peer may not call, or None."""
        if uid in (0, os.geteuid()):
            return None
        if self.gid is not None and (gid == self.gid
                                     or self.gid in _groups(pid)):
            return None
        return ('uid %d is neither root nor in the socket\'s group' % uid
                if self.gid is not None else
                'uid %d is not root (no [vmar_host] api_socket_group set)'
                % uid)

    def dispatch(self, req):
        version = req.get('api')
        if version not in protocol.VERSIONS:
            raise exception.UnsupportedVersion(
                version=version,
                supported=', '.join(map(str, protocol.VERSIONS)))
        op = OPS.get(req.get('op'))
        if op is None:
            raise exception.HostApiError(reason='no operation %r'
                                         % (req.get('op'),))
        args = req.get('args') or {}
        if not isinstance(args, dict):
            raise exception.HostApiError(reason='args is a JSON object')
        return op(self.service, args)


class ApiServer:
    """The API socket of an export service, served by threads.

    ``start()`` publishes the socket and returns; ``stop()`` removes it
    and waits for the listening thread (calls under way finish on their
    own threads).
    """

    def __init__(self, service):
        self.service = service
        self.path = client.socket_path(service.conf)
        self.group = service.conf.vmar_host.api_socket_group
        self.gid = grp.getgrnam(self.group).gr_gid if self.group else None
        self._server = None
        self._thread = None

    def start(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + '.starting'
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        self._server = _Server(tmp, self.service, self.gid)
        fileutils.publish_socket(tmp, self.path, self.group)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name='vmar-host-api', daemon=True)
        self._thread.start()
        LOG.info('host API version %s on %s',
                 '/'.join(map(str, protocol.VERSIONS)), self.path)
        return self

    def stop(self):
        if self._server is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = None
