"""Nova integration: the libvirt image backend for vmar flavors.

Not implemented yet (tracked by the Nova integration issue). The package
exists so that the layout matches what OpenStack plugin users expect.
"""
