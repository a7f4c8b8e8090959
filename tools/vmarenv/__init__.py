"""The real services the functional tests, tools and benchmarks run on.

One module per external service, as ``nova/tests/fixtures/`` has:

* :mod:`.qemu_env`: the patched QEMU, libvirt and the Debian image library;
* :mod:`.services`: MariaDB and PostgreSQL;
* :mod:`.rabbitmq_env`: a private RabbitMQ node;
* :mod:`.glance_env`: glance-api (with a test double for Keystone's
  authtoken);
* :mod:`.ceph_env`: a single-node Ceph;
* :mod:`.proxy_env`: a TCP proxy that makes outages and hangs;
* :mod:`.process`: what they share: processes tagged with their owner,
  free ports, log tails (``tools/cloud`` runs its services on it too).

Shared by ``tests/functional``, ``tools/cloud_scenario.py`` and ``bench/``,
so that tools and benchmarks do not import the tests.
"""
