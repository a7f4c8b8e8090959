"""nova-api's WSGI application with the vmar checks (:mod:`.checks`).

Run it where Nova's is run, e.g. uWSGI's
``module = vmar_openstack.nova_api.wsgi:application`` instead of
``nova.wsgi.osapi_compute:application``.

Nova's module comes first: it chooses the concurrency mode before anything
imports eventlet. The checks (:mod:`.checks`) wrap class methods
(:mod:`vmar_openstack.nova_wrappers`), which the API's controllers look up
on every call.
"""

from nova.wsgi.osapi_compute import application  # noqa: F401

from vmar_openstack import nova_wrappers

nova_wrappers.install(nova_wrappers.API)
