"""``vmar-nova-compute``: Nova's own nova-compute, with the vmar backend.

Stock Nova has no plugin hook for libvirt image backends, so this console
script registers the vmar backend (see
:mod:`vmar_openstack.nova_wrappers`) and its one option group,
``[vmar_compute]``, then runs ``nova.cmd.compute.main()`` unchanged: same
arguments, same configuration files, same service binary name
(``nova-compute``). nova-compute reads no other vmar option: the host's
export daemon holds the rest, Glance credentials included.
"""

import sys

# Importing it monkey-patches the process as nova-compute's own start does.
from nova.cmd import compute  # noqa: I202

from vmar_openstack import conf as vmar_conf
from vmar_openstack.conf import compute as compute_conf
from vmar_openstack import nova_wrappers


def main():
    vmar_conf.register_opts(groups=(compute_conf,))
    nova_wrappers.install(nova_wrappers.COMPUTE)
    return compute.main()


if __name__ == '__main__':
    sys.exit(main())
