"""Developer tools of vmar-openstack (scripts, and :mod:`tools.vmarenv`)."""
