"""Nova scheduler integration: placing vmar servers by similarity.

It owns :mod:`.weigher`, the ``vmar`` host weigher that nova-scheduler loads
from ``[filter_scheduler] weight_classes``. It reads what the hosts hold
from the cluster database (:class:`vmar_openstack.db.hosts.HostReports`),
where vmar-agent records the hosts' reports.
"""
