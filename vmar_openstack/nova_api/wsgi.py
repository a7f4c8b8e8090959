"""nova-api's WSGI application with the vmar checks (:mod:`.checks`).

Run it where Nova's is run, e.g. uWSGI's
``module = vmar_openstack.nova_api.wsgi:application`` instead of
``nova.wsgi.osapi_compute:application``.
"""

from vmar_openstack.nova_api import checks

checks.register()

from nova.wsgi.osapi_compute import application  # noqa: E402,F401,H306
