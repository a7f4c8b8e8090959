"""Resume guests that paused on an I/O error once their exports are back.

A vmar disk stops the guest on an I/O error (``error_policy='stop'``,
:class:`~vmar_openstack.nova_imagebackend.image.VmarDiskConfig`): when
the export daemon dies, its guests pause instead of seeing EIO. vmar-export
restarts the daemon and restores its exports, but nothing in Nova resumes
a guest that libvirt paused by itself (its power-state sync leaves an
ACTIVE instance that is paused alone). This does: every
``[vmar_compute] resume_interval`` seconds, in ``vmar-nova-compute``, each
domain that libvirt paused for an I/O error, whose vmar disks' exports are all
being served again, is resumed. Guests paused by a user, or whose disks
are not vmar disks, are never touched.
"""

from xml.etree import ElementTree

from oslo_log import log as logging
from oslo_service import loopingcall

from vmar_openstack import exception as vmar_exception
from vmar_openstack import names
from vmar_openstack.nova_imagebackend import driver as driver_access

LOG = logging.getLogger(__name__)


def vmar_exports(domain_xml, socket):
    """The export names a domain's disks read through ``socket``."""
    found = set()
    root = ElementTree.fromstring(domain_xml)
    for source in root.iter('source'):
        if source.get('protocol') != 'nbd':
            continue
        host = source.find('host')
        if host is None or host.get('socket') != socket:
            continue
        name = source.get('name') or ''
        if names.parse_export(name):
            found.add(name)
    return found


class Resumer(object):
    """One pass over the host's paused domains (:meth:`run_once`)."""

    def __init__(self, exports, libvirt_module):
        self.exports = exports        # the host API's client
        self.libvirt = libvirt_module

    def _live_exports(self, names):
        """Which of ``names`` the daemon serves now; None if it is down."""
        try:
            health = self.exports.health(names)
        except vmar_exception.VmarException as e:
            LOG.debug('export service not answering: %s', e)
            return None
        return set(health['served']) if health['daemon_up'] else None

    def _paused_on_io_error(self, domain):
        state, reason = domain.state()
        return (state == self.libvirt.VIR_DOMAIN_PAUSED and
                reason == self.libvirt.VIR_DOMAIN_PAUSED_IOERROR)

    def run_once(self, conn):
        """Resume what can be resumed; return the names resumed."""
        candidates = []
        for domain in conn.listAllDomains(
                self.libvirt.VIR_CONNECT_LIST_DOMAINS_PAUSED):
            if not self._paused_on_io_error(domain):
                continue
            candidates.append(domain)
        if not candidates:
            return []
        try:
            socket = self.exports.nbd_socket()
        except vmar_exception.VmarException as e:
            LOG.debug('export service not answering: %s', e)
            return []
        candidates = [(d, vmar_exports(d.XMLDesc(0), socket))
                      for d in candidates]
        candidates = [(d, w) for d, w in candidates if w]
        if not candidates:
            return []
        live = self._live_exports(set().union(*(w for _d, w
                                                in candidates)))
        resumed = []
        for domain, wanted in candidates:
            missing = wanted - (live or set())
            if missing:
                LOG.info('%s paused on an I/O error; waiting for exports '
                         '%s', domain.name(), ', '.join(sorted(missing)))
                continue
            try:
                domain.resume()
            except self.libvirt.libvirtError as e:
                LOG.warning('could not resume %s: %s', domain.name(), e)
                continue
            LOG.warning('resumed %s, paused on an I/O error of its vmar '
                        'disk, now that %s is served again', domain.name(),
                        ', '.join(sorted(wanted)))
            resumed.append(domain.name())
        return resumed


def start(driver, exports, interval):
    """Run :meth:`Resumer.run_once` every ``interval`` s in this process.

    ``driver`` is the compute host's LibvirtDriver (its libvirt connection
    is used), ``exports`` the host API's client. Returns the looping call,
    or None when ``interval`` is 0.
    """
    if not interval:
        return None
    import libvirt
    resumer = Resumer(exports, libvirt)

    def _pass():
        try:
            resumer.run_once(driver_access.connection(driver))
        except Exception:   # keep the loop: the next pass may work
            LOG.exception('resuming guests paused on I/O errors failed')
    timer = loopingcall.FixedIntervalLoopingCall(_pass)
    timer.start(interval=interval, initial_delay=interval)
    LOG.info('resuming guests paused on vmar I/O errors every %d s',
             interval)
    return timer
