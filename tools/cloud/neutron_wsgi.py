"""Neutron's API application, with its SQLAlchemy mappers configured.

``neutron.wsgi.api:application`` as it is, plus one call: Neutron 29's
``get_ports`` reads the backref ``Port.port_forwardings`` (declared by the
port forwarding model) before its first query, and SQLAlchemy creates
backrefs only when the mappers are configured, which a query does. In a
fresh API process whose first request is ``GET /v2.0/ports`` (Nova's
server show and list, with no networks at all) that request fails with
``AttributeError: type object 'Port' has no attribute 'port_forwardings'``.
"""

from neutron.wsgi.api import application  # noqa: F401
from sqlalchemy import orm

orm.configure_mappers()
