"""Drop the export references of instances that have left this host.

An instance holds its export (holder = its UUID) from the first boot until
Nova deletes its files or it moves away
(:mod:`vmar_openstack.nova_wrappers`). A compute service
killed between the two, or a Nova path that removes an instance directory
without calling the driver, leaves the reference behind, and with it the
export and the files it reads, until an operator runs ``vmar-export
release``.

At start, in ``init_host``, before this process runs any operation on an
instance, the backend drops the references of holders that are instance
UUIDs and have neither a directory under ``[DEFAULT] instances_path``
(``<uuid>``, or ``<uuid>_resize`` on the source of a resize that is not
confirmed yet) nor a libvirt domain on this host. Holders that are not
UUIDs (``vmar-export add --holder``, the default ``cli``) are an
operator's and are never touched.
"""

import os
import uuid

from oslo_log import log as logging

from vmar_openstack import exception as vmar_exception

LOG = logging.getLogger(__name__)

# what an instance's directory is named while the instance is on the host
_DIR_SUFFIXES = ('', '_resize')


def _instance_uuid(holder):
    """``holder`` if it is an instance UUID as Nova writes one, else None."""
    try:
        canonical = str(uuid.UUID(holder))
    except ValueError:
        return None
    return holder if canonical == holder else None


def stale(holders, instances_path, domains):
    """The holders among ``holders`` whose instance is not on this host.

    ``domains`` are the UUIDs of the libvirt domains defined here.
    """
    out = []
    for holder in sorted(holders):
        instance = _instance_uuid(holder)
        if instance is None or instance in domains:
            continue
        if any(os.path.exists(os.path.join(instances_path, instance + s))
               for s in _DIR_SUFFIXES):
            continue
        out.append(holder)
    return out


def release_stale(exports, instances_path, domains):
    """Release the references of :func:`stale` holders; their names.

    ``exports`` is the host API's client. Never raises for the export
    daemon's sake: a host whose daemon is down or cannot read its state
    keeps its references, and the next start tries again.
    """
    try:
        gone = stale(exports.holders(), instances_path, set(domains))
    except vmar_exception.ExportDaemonDown as e:
        LOG.info('no export references reconciled: %s', e)
        return []
    except (vmar_exception.VmarException, OSError) as e:
        LOG.warning('could not read the export holders: %s', e)
        return []
    released = []
    for holder in gone:
        try:
            names = exports.release(holder)
        except (vmar_exception.VmarException, OSError) as e:
            LOG.warning('instance %s is not on this host but could not '
                        'release its exports: %s; run "vmar-export release '
                        '%s"', holder, e, holder)
            continue
        LOG.warning('instance %s has no directory or domain on this host: '
                    'released its exports %s', holder, ', '.join(names))
        released.append(holder)
    return released
