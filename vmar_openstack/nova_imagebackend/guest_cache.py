"""The host side of ``vmar:guest_cache=private`` and ``=auto``.

VMAR's second cache mode (guest-private caching): the host caches base
data once (host-cache-for-base), and each guest caches only its private
data. The guest side is a component inside the guest; on the host, a
guest-private server, and an ``auto`` one (the host switches it between
guest-private and the guest's own caching while it runs), gets:

* a virtio memory balloon with free page reporting on, so the memory the
  guest frees (the base data it drops) goes back to the host. Nova adds one
  only while ``[libvirt] mem_stats_period_seconds`` is above 0, and a
  ``model='none'`` balloon otherwise; such a server always gets a virtio
  one;
* the SMBIOS OEM strings ``vmar:guest_cache=private`` (or ``=auto``), and
  ``vmar:guest_reporting_order=N`` when ``[vmar_compute]
  guest_reporting_order`` is set (type 11, in the domain's ``<sysinfo>``):
  the guest component, ``vmar-guest``, reads them and does nothing on a
  server without the first, so images can carry it whatever flavor boots
  them;
* a virtio-serial channel (``<channel type='unix'>``, port
  :data:`vmar_openstack.names.GUEST_CHANNEL_PORT`) whose socket QEMU binds
  in the export daemon's channel directory: the daemon tells the guest its
  mode over it and reads its status
  (:mod:`vmar_openstack.host.guests.channels`);
* a warning in the compute log when the image does not say it carries
  the component (image property :data:`IMAGE_PROPERTY`): the guest then
  keeps its cache as before, unless user-data delivered the component
  (``vmar-guest-userdata``);
* a record of what it was given, in the domain XML's metadata
  (``<vmar:guest>`` in :data:`NAMESPACE`), built with Nova's own config
  classes like the rest of the domain.
"""

import os

from lxml import etree
from nova.virt.libvirt import config as vconfig
from oslo_log import log as logging

from vmar_openstack import names

NAMESPACE = 'https://opendev.org/x/vmar-openstack/guest/1.0'
DEFAULT, PRIVATE, AUTO = names.GUEST_CACHE
MODES = names.GUEST_CACHE
# What the guest component looks for (guest/vmar-guest.c: OEM_KEY and
# OEM_ORDER)
OEM_KEY = 'vmar:guest_cache='
OEM_ORDER = 'vmar:guest_reporting_order='
# The image property that says an image carries vmar-guest ('1'), and how
# Nova keeps image properties in an instance's system metadata
IMAGE_PROPERTY = 'vmar_guest'
_SYSMETA_KEY = 'image_' + IMAGE_PROPERTY

LOG = logging.getLogger(__name__)


class VmarSysinfo(vconfig.LibvirtConfigGuestSysinfo):
    """Nova's ``<sysinfo type='smbios'>`` with ``<oemStrings>`` added."""

    def __init__(self, base=None, **kwargs):
        super().__init__(**kwargs)
        if base is not None:
            self.__dict__.update(vars(base))
        self.oem_strings = []

    def format_dom(self):
        root = super().format_dom()
        if self.oem_strings:
            oem = etree.SubElement(root, 'oemStrings')
            for value in self.oem_strings:
                oem.append(self._text_node('entry', value))
        return root


class VmarGuestMetadata(vconfig.LibvirtConfigObject):
    """``<vmar:guest>``: the vmar settings a domain was built with."""

    def __init__(self, **kwargs):
        super().__init__(root_name='guest', ns_prefix='vmar',
                         ns_uri=NAMESPACE, **kwargs)
        self.host_cache = None
        self.guest_cache = None
        self.free_page_reporting = None
        self.guest_component = None
        self.channel = None

    def format_dom(self):
        root = super().format_dom()
        for name in ('host_cache', 'guest_cache', 'free_page_reporting',
                     'guest_component', 'channel'):
            value = getattr(self, name)
            if value is not None:
                root.append(self._text_node(name.replace('_', '-'),
                                            value))
        return root


def _balloon(guest):
    for dev in guest.devices:
        if isinstance(dev, vconfig.LibvirtConfigMemoryBalloon):
            return dev
    return None


def image_carries_component(instance):
    """Whether the instance's image says it carries vmar-guest."""
    return (instance.system_metadata or {}).get(_SYSMETA_KEY) == '1'


def apply(guest, policy, instance, channel_dir=None, reporting_order=None):
    """Give a guest config (LibvirtConfigGuest) what ``policy`` asks.

    ``policy`` is the flavor's (:func:`..image.flavor_policy`);
    ``channel_dir`` the export daemon's channel directory (None: it has
    none, and an ``auto`` server stays in its own caching);
    ``reporting_order`` ``[vmar_compute] guest_reporting_order``. Returns
    the metadata record added.
    """
    mode = policy.get('guest_cache', DEFAULT)
    dropping = mode in (PRIVATE, AUTO)
    carries = image_carries_component(instance)
    if dropping and not carries:
        LOG.warning('Instance %s is guest-%s but its image %s does not '
                    'carry vmar-guest (image property %s=1): the guest '
                    'keeps base data in its cache unless its user-data '
                    'installs the component (vmar-guest-userdata).',
                    instance.uuid, mode, instance.image_ref, IMAGE_PROPERTY)
    if dropping and channel_dir is None:
        LOG.warning('Instance %s is guest-%s but the export daemon has no '
                    'guest channels ([vmar_guest_cache] interval = 0, or a '
                    'daemon of before them): %s', instance.uuid, mode,
                    'it stays in its own caching' if mode == AUTO else
                    'nobody sees its status')
    meta = VmarGuestMetadata()
    if dropping:
        balloon = _balloon(guest)
        if balloon is None:
            balloon = vconfig.LibvirtConfigMemoryBalloon()
            guest.add_device(balloon)
        # Nova's balloon config always writes freePageReporting='on' and
        # autodeflate='on'; the model is what it leaves out when
        # [libvirt] mem_stats_period_seconds is 0
        balloon.model = 'virtio'
        sysinfo = VmarSysinfo(guest.sysinfo)
        sysinfo.oem_strings.append(OEM_KEY + mode)
        if reporting_order is not None:
            sysinfo.oem_strings.append(OEM_ORDER + str(reporting_order))
        guest.sysinfo = sysinfo
        if guest.os_smbios is None:
            guest.os_smbios = vconfig.LibvirtConfigGuestSMBIOS()
        if channel_dir is not None:
            channel = vconfig.LibvirtConfigGuestChannel()
            channel.type = 'unix'
            channel.source_path = os.path.join(
                channel_dir, names.guest_channel(instance.uuid, mode))
            channel.target_name = names.GUEST_CHANNEL_PORT
            guest.add_device(channel)
            meta.channel = channel.source_path
        meta.free_page_reporting = 'on'
        meta.guest_component = 'image' if carries else 'unknown'
    meta.host_cache = policy.get('host_cache')
    meta.guest_cache = mode
    guest.metadata.append(meta)
    return meta
