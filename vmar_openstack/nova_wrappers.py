"""Every Nova method vmar wraps, in one table, and the one way to wrap it.

Nova has no plugin point for libvirt image backends nor for checks in its
compute API, so vmar wraps a few methods of Nova's own classes, in the
process that needs them only: ``install('compute')`` in
``vmar-nova-compute`` (:mod:`vmar_openstack.cmd.nova_compute`),
``install('api')`` in nova-api's WSGI application
(:mod:`vmar_openstack.nova_api.wsgi`).

:data:`TABLE` lists each wrapped method as ``(service, class, method,
wrapper)``. A wrapper is a top-level function of this module called as
``wrapper(original, self, *args, **kwargs)``; it acts for vmar instances
only and calls ``original`` otherwise. :data:`PRIVATE` lists the private
attributes of Nova's classes vmar reaches, each through one helper of
:mod:`vmar_openstack.nova_imagebackend.driver`. Neither is a stable API:
``tests/unit/test_nova_signatures.py`` pins their signatures for every
Nova release vmar supports.

What each compute wrapper does (doc/source/admin/nova.rst,
doc/source/admin/multinode.rst):

* ``Backend.by_name`` / ``by_libvirt_path``: the root disk of an instance
  whose flavor has ``vmar:enabled=true`` is a
  :class:`~vmar_openstack.nova_imagebackend.image.VmarImage`; every other
  disk keeps the configured backend;
* ``LibvirtDriver.init_host``: references of instances that left the host
  are dropped (:mod:`~vmar_openstack.nova_imagebackend.reconcile`), and
  the resumer of guests paused on I/O errors starts
  (:mod:`~vmar_openstack.nova_imagebackend.resume`);
* ``_get_guest_config``: the guest-private cache policy
  (:mod:`~vmar_openstack.nova_imagebackend.guest_cache`);
* ``delete_instance_files``, ``confirm_migration``,
  ``rollback_live_migration_at_destination``: the host's references go
  with the instance;
* ``_live_snapshot``: Nova's own live snapshot, whose copy of the disk's
  top layer has its pinned NBD backing
  (:mod:`~vmar_openstack.nova_imagebackend.snapshot`; the first route is
  the backend's ``direct_snapshot``, which sends the delta only);
* ``get_instance_disk_info`` / ``_create_images_and_backing``: a live
  migration carries the overlay's backing, and the destination adopts it;
* ``migrate_disk_and_power_off``: a resize that would switch the backend
  is refused before anything is touched.

The API wrappers refuse, with the reason in the HTTP answer, the moves
:mod:`vmar_openstack.nova_api.checks` says cannot be done safely.
"""

import collections
import functools
import os

from nova.compute import api as compute_api
from nova.compute import utils as compute_utils
import nova.conf as nova_conf
from nova import exception
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import host as libvirt_host
from nova.virt.libvirt import imagebackend
from oslo_log import log as logging
from oslo_serialization import jsonutils

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception as vmar_exception
from vmar_openstack import names
from vmar_openstack.nova_api import checks
from vmar_openstack.nova_imagebackend import driver as driver_access
from vmar_openstack.nova_imagebackend import extra_specs
from vmar_openstack.nova_imagebackend import guest_cache
from vmar_openstack.nova_imagebackend import image as vimage
from vmar_openstack.nova_imagebackend import reconcile
from vmar_openstack.nova_imagebackend import resume
from vmar_openstack.nova_imagebackend import snapshot

LOG = logging.getLogger(__name__)

COMPUTE, API = 'compute', 'api'

Wrapped = collections.namedtuple('Wrapped', 'service cls method wrapper')
Private = collections.namedtuple('Private', 'cls attribute helper')

# the resumer of each driver that started one (init_host)
RESUMERS = {}


def _is_vmar(instance):
    try:
        return vimage.instance_policy(instance) is not None
    except exception.InvalidInput:
        return True


# -- vmar-nova-compute: the image backend ---------------------------------

def by_name(original, self, instance, name, image_type=None,
            disk_info_mapping=None):
    if vimage.is_root_disk(name) and _is_vmar(instance):
        return vimage.VmarImage(instance=instance, disk_name=name,
                                disk_info_mapping=disk_info_mapping)
    return original(self, instance, name, image_type=image_type,
                    disk_info_mapping=disk_info_mapping)


def by_libvirt_path(original, self, instance, path, image_type=None):
    if vimage.is_root_disk(path) and _is_vmar(instance):
        return vimage.VmarImage(instance=instance, path=path)
    return original(self, instance, path, image_type=image_type)


# -- vmar-nova-compute: the driver ----------------------------------------

def init_host(original, self, host):
    result = original(self, host)
    driver_access.register(self)
    exports = vimage.host()
    reconcile.release_stale(exports, nova_conf.CONF.instances_path,
                            self.list_instance_uuids())
    RESUMERS[id(self)] = resume.start(
        self, exports, vmar_conf.CONF.vmar_compute.resume_interval)
    return result


def get_guest_config(original, self, instance, *args, **kwargs):
    guest = original(self, instance, *args, **kwargs)
    policy = vimage.instance_policy(instance)
    if policy is not None:
        guest_cache.apply(
            guest, policy, instance, _guest_channel_dir(policy),
            vmar_conf.CONF.vmar_compute.guest_reporting_order)
    return guest


def _guest_channel_dir(policy):
    """The daemon's guest channel directory, if the server needs one."""
    if policy.get('guest_cache') not in names.GUEST_CHANNEL_MODES:
        return None
    try:
        return vimage.host().guest_channel_dir()
    except vmar_exception.VmarException as e:
        # a dead daemon must not fail a reboot: the guest then runs
        # without its channel until the next one
        LOG.warning('no guest channel: the export daemon does not '
                    'answer: %s', e)
        return None


def delete_instance_files(original, self, instance):
    done = original(self, instance)
    if done and _is_vmar(instance):
        vimage.release(instance.uuid)
    return done


def live_snapshot(original, self, context, instance, guest, disk_path,
                  out_path, source_format, image_format, image_meta):
    if not (vimage.is_root_disk(disk_path) and _is_vmar(instance)):
        return original(self, context, instance, guest, disk_path,
                        out_path, source_format, image_format, image_meta)
    return snapshot.live_snapshot(
        self, vimage.VmarImage(instance=instance, path=disk_path), guest,
        disk_path, out_path, image_format)


def get_instance_disk_info(original, self, instance, block_device_info=None):
    # what the source of a block migration sends the destination (Nova's
    # resource periodic reads the private method, not this)
    disks = jsonutils.loads(original(self, instance, block_device_info))
    if not _is_vmar(instance):
        return jsonutils.dumps(disks)
    socket = os.path.basename(vimage.host().nbd_socket())
    for info in disks:
        if (vimage.is_root_disk(info['path'])
                and info.get('backing_file') == socket):
            # Nova keeps only the backing file's base name; the
            # destination of a live migration needs all of it
            backing = vimage.backing_of(info['path'])
            if backing:
                info['vmar_backing'] = backing
    return jsonutils.dumps(disks)


def create_images_and_backing(original, self, context, instance,
                              instance_dir, disk_info,
                              fallback_from_host=None):
    rest = []
    for info in disk_info or []:
        if info.get('vmar_backing') and vimage.is_root_disk(
                info['path']) and _is_vmar(instance):
            vimage.VmarImage(
                instance=instance,
                path=os.path.join(instance_dir, 'disk')).adopt(
                    info['vmar_backing'], info['virt_disk_size'])
        else:
            rest.append(info)
    return original(self, context, instance, instance_dir, rest,
                    fallback_from_host=fallback_from_host)


def rollback_live_migration_at_destination(original, self, context,
                                           instance, *args, **kwargs):
    try:
        return original(self, context, instance, *args, **kwargs)
    finally:
        # Nova removes the instance directory itself, past
        # delete_instance_files; the guest still runs on the source
        if _is_vmar(instance) and instance.host != nova_conf.CONF.host:
            vimage.release(instance.uuid)


def migrate_disk_and_power_off(original, self, context, instance, dest,
                               flavor, *args, **kwargs):
    reason = extra_specs.switch_refusal(instance.flavor, flavor)
    if reason and not compute_utils.is_volume_backed_instance(
            context, instance):
        raise exception.InstanceFaultRollback(exception.ResizeError(
            reason=reason))
    return original(self, context, instance, dest, flavor, *args, **kwargs)


def confirm_migration(original, self, context, migration, instance,
                      network_info):
    result = original(self, context, migration, instance, network_info)
    if (migration.source_compute != migration.dest_compute
            and _is_vmar(instance)):
        # the overlay went with the instance; this host's references on
        # its export go now (a same-host resize keeps them)
        vimage.release(instance.uuid)
    return result


# -- nova-api: moves refused up front -------------------------------------

def api_resize(original, self, context, instance, flavor_id=None, *args,
               **kwargs):
    """``API.resize``; a cold migration is a resize without a flavor."""
    checks.check_resize(context, instance, flavor_id)
    return original(self, context, instance, flavor_id, *args, **kwargs)


def api_live_migrate(original, self, context, instance, *args, **kwargs):
    checks.check_move(context, instance)
    return original(self, context, instance, *args, **kwargs)


def api_evacuate(original, self, context, instance, *args, **kwargs):
    checks.check_move(context, instance)
    return original(self, context, instance, *args, **kwargs)


B = imagebackend.Backend
D = libvirt_driver.LibvirtDriver

TABLE = (
    Wrapped(COMPUTE, B, 'by_name', by_name),
    Wrapped(COMPUTE, B, 'by_libvirt_path', by_libvirt_path),
    Wrapped(COMPUTE, D, 'init_host', init_host),
    Wrapped(COMPUTE, D, '_get_guest_config', get_guest_config),
    Wrapped(COMPUTE, D, 'delete_instance_files', delete_instance_files),
    Wrapped(COMPUTE, D, '_live_snapshot', live_snapshot),
    Wrapped(COMPUTE, D, 'get_instance_disk_info', get_instance_disk_info),
    Wrapped(COMPUTE, D, '_create_images_and_backing',
            create_images_and_backing),
    Wrapped(COMPUTE, D, 'rollback_live_migration_at_destination',
            rollback_live_migration_at_destination),
    Wrapped(COMPUTE, D, 'migrate_disk_and_power_off',
            migrate_disk_and_power_off),
    Wrapped(COMPUTE, D, 'confirm_migration', confirm_migration),
    Wrapped(API, compute_api.API, 'resize', api_resize),
    Wrapped(API, compute_api.API, 'live_migrate', api_live_migrate),
    Wrapped(API, compute_api.API, 'evacuate', api_evacuate),
)

PRIVATE = (
    Private(D, '_host', driver_access.connection),
    Private(D, '_host', driver_access.guest),
    Private(D, '_delete_guest_configuration',
            driver_access.delete_guest_configuration),
    Private(libvirt_host.Host, 'write_instance_config',
            driver_access.write_instance_config),
)

# (class, method) -> Nova's own method, while installed
_ORIGINALS = {}


def install(service):
    """Wrap the methods :data:`TABLE` lists for ``service`` (idempotent)."""
    for w in TABLE:
        if w.service != service or (w.cls, w.method) in _ORIGINALS:
            continue
        original = getattr(w.cls, w.method)
        _ORIGINALS[(w.cls, w.method)] = original
        setattr(w.cls, w.method, _wrapper(w.wrapper, original))
    LOG.info('vmar wrappers of nova-%s installed: %s', service, ', '.join(
        '%s.%s' % (w.cls.__name__, w.method) for w in TABLE
        if w.service == service))


def _wrapper(wrapper, original):
    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return wrapper(original, *args, **kwargs)
    return wrapped


def original(cls, method):
    """Nova's own ``cls.method`` (the installed one if not wrapped)."""
    return _ORIGINALS.get((cls, method), getattr(cls, method))


def uninstall():
    """Put Nova's own methods back (for tests)."""
    for (cls, method), nova_method in _ORIGINALS.items():
        setattr(cls, method, nova_method)
    _ORIGINALS.clear()
