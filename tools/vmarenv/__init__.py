"""The real services the functional tests, tools and benchmarks run on.

* :mod:`.qemu_env`: the patched QEMU, libvirt and the Debian image library;
* :mod:`.services`: MariaDB and PostgreSQL;
* :mod:`.glance_env`: RabbitMQ and glance-api.

Shared by ``tests/functional``, ``tools/cloud_scenario.py`` and ``bench/``,
so that tools and benchmarks do not import the tests.
"""
