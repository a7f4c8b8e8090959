"""The reports of compute hosts: which map versions each one exports.

``vmar-export serve`` sends its host's exports every ``[vmar]
report_interval`` seconds; ``vmar-agent`` records the last report of each
host here (``vmar_hosts``, ``vmar_host_exports``), stamped with the time
the agent received it. A host's last report stands until it reports again
or an operator forgets it: a host that is down still holds what its
instances use.
"""

import dataclasses
import datetime

import sqlalchemy as sa

from vmar_openstack.db import models
from vmar_openstack.db import session as db_session


@dataclasses.dataclass(frozen=True)
class Host:
    host: str
    reported_at: datetime.datetime
    exports: tuple             # ((image_id, map_version), ...), sorted


class HostReports:
    """The ``vmar_hosts`` and ``vmar_host_exports`` tables."""

    def __init__(self, conf):
        self.conf = conf

    def record(self, host, exports, reported_at=None):
        """Replace ``host``'s report with ``exports`` ((id, version)...)."""
        rows = sorted({(str(i), int(v)) for i, v in exports})
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.delete(models.HostExport).where(
                models.HostExport.host == host))
            report = s.get(models.HostReport, host)
            if report is None:
                report = models.HostReport(host=host)
                s.add(report)
            report.reported_at = reported_at or models.utcnow()
            s.flush()
            s.add_all(models.HostExport(host=host, image_id=i, map_version=v)
                      for i, v in rows)

    def list(self):
        with db_session.reader(self.conf) as s:
            reports = s.execute(sa.select(models.HostReport).order_by(
                models.HostReport.host)).scalars().all()
            held = {}
            for e in s.execute(sa.select(models.HostExport)).scalars():
                held.setdefault(e.host, []).append((e.image_id,
                                                    e.map_version))
            return [Host(r.host, r.reported_at,
                         tuple(sorted(held.get(r.host, ()))))
                    for r in reports]

    def forget(self, host):
        """Drop a host's report; whether there was one."""
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.delete(models.HostExport).where(
                models.HostExport.host == host))
            return s.execute(sa.delete(models.HostReport).where(
                models.HostReport.host == host)).rowcount > 0
