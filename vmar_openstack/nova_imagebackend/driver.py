"""What vmar reaches of the libvirt driver's private parts, and how.

Each helper is the one place its private attribute is used;
:data:`vmar_openstack.nova_wrappers.PRIVATE` names them, and
``tests/unit/test_nova_signatures.py`` checks that the attributes are
still there, with the signatures vmar expects, in every Nova release it
supports.
"""

from nova import exception


# the libvirt driver of this nova-compute process, once it started
_DRIVER = []


def register(driver):
    """Remember the process's driver (its ``init_host``)."""
    _DRIVER[:] = [driver]


def current():
    """The process's libvirt driver, or None before ``init_host``."""
    return _DRIVER[0] if _DRIVER else None


def guest(driver, instance):
    """The instance's libvirt guest (``driver._host``), None if none."""
    try:
        return driver._host.get_guest(instance)
    except exception.InstanceNotFound:
        return None


def connection(driver):
    """The driver's libvirt connection (``driver._host``)."""
    return driver._host.get_connection()


def delete_guest_configuration(driver, guest):
    """Undefine a domain's persistent configuration, keeping vTPM and NVRAM.

    As Nova does before a block job.
    """
    driver._delete_guest_configuration(guest, keep_vtpm=True,
                                       keep_nvram=True)


def write_instance_config(driver, xml):
    """Define a domain again from ``xml`` (``driver._host``)."""
    driver._host.write_instance_config(xml)
