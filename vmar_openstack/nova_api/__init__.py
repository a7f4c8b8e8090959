"""nova-api integration: what nova-api refuses of vmar servers, up front.

* :mod:`.checks`: the checks, wrapped around ``nova.compute.api.API`` in
  the nova-api process only (Nova has no plugin point there);
* :mod:`.wsgi`: nova-api's WSGI application with the checks installed,
  which uWSGI runs instead of ``nova.wsgi.osapi_compute``.

A move that cannot be done safely (a resize that switches the vmar
backend, a move of a server whose image is gone from Glance) is refused
here, with its reason in the HTTP answer, before any state changes
(doc/source/admin/multinode.rst).
"""
