"""The host side of ``vmar:guest_cache=private`` (guest-private caching).

VMAR's second cache mode: the host caches base data once
(host-cache-for-base), and each guest caches only its private data. The
guest side is a component inside the guest; on the host, a guest-private
server gets:

* a virtio memory balloon with free page reporting on, so the memory the
  guest frees (the base data it drops) goes back to the host. Nova adds one
  only while ``[libvirt] mem_stats_period_seconds`` is above 0, and a
  ``model='none'`` balloon otherwise; a guest-private server always gets a
  virtio one;
* the SMBIOS OEM string ``vmar:guest_cache=private`` (type 11, in the
  domain's ``<sysinfo>``): the guest component, ``vmar-guest``, reads it
  and does nothing on a server without it, so images can carry it whatever
  flavor boots them;
* a warning in the compute log when the image does not say it carries
  the component (image property :data:`IMAGE_PROPERTY`): the guest then
  keeps its cache as before, unless user-data delivered the component
  (``vmar-guest-userdata``);
* a record of what it was given, in the domain XML's metadata
  (``<vmar:guest>`` in :data:`NAMESPACE`), built with Nova's own config
  classes like the rest of the domain.
"""

from lxml import etree
from nova.virt.libvirt import config as vconfig
from oslo_log import log as logging

NAMESPACE = 'https://opendev.org/x/vmar-openstack/guest/1.0'
PRIVATE, DEFAULT = 'private', 'default'
MODES = (PRIVATE, DEFAULT)
# What the guest component looks for (guest/vmar-guest.c: OEM_KEY)
OEM_STRING = 'vmar:guest_cache=' + PRIVATE
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

    def format_dom(self):
        root = super().format_dom()
        for name in ('host_cache', 'guest_cache', 'free_page_reporting',
                     'guest_component'):
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


def apply(guest, policy, instance):
    """Give a guest config (LibvirtConfigGuest) what ``policy`` asks.

    ``policy`` is the flavor's (:func:`..image.flavor_policy`). Returns the
    metadata record added.
    """
    private = policy.get('guest_cache') == PRIVATE
    carries = image_carries_component(instance)
    if private and not carries:
        LOG.warning('Instance %s is guest-private but its image %s does not '
                    'carry vmar-guest (image property %s=1): the guest '
                    'keeps base data in its cache unless its user-data '
                    'installs the component (vmar-guest-userdata).',
                    instance.uuid, instance.image_ref, IMAGE_PROPERTY)
    if private:
        balloon = _balloon(guest)
        if balloon is None:
            balloon = vconfig.LibvirtConfigMemoryBalloon()
            guest.add_device(balloon)
        # Nova's balloon config always writes freePageReporting='on' and
        # autodeflate='on'; the model is what it leaves out when
        # [libvirt] mem_stats_period_seconds is 0
        balloon.model = 'virtio'
        sysinfo = VmarSysinfo(guest.sysinfo)
        sysinfo.oem_strings.append(OEM_STRING)
        guest.sysinfo = sysinfo
        if guest.os_smbios is None:
            guest.os_smbios = vconfig.LibvirtConfigGuestSMBIOS()
    meta = VmarGuestMetadata()
    meta.host_cache = policy.get('host_cache')
    meta.guest_cache = policy.get('guest_cache', DEFAULT)
    meta.free_page_reporting = 'on' if private else None
    if private:
        meta.guest_component = 'image' if carries else 'unknown'
    guest.metadata.append(meta)
    return meta
