"""tools/cloud.sh: an all-in-one OpenStack on this machine.

* :mod:`.config`: settings (ports, passwords) and the configuration files
  rendered from the templates in ``etc/cloud``;
* :mod:`.services`: how one daemon of the cloud starts, is found and stops;
* :mod:`.stack`: the services in start order, ``up``, ``down``, ``status``;
* :mod:`.keystone_setup`: service users, catalogue and endpoints.

See doc/source/install/cloud.rst.
"""
