"""Indexes for the weigher's lookup at a thousand hosts.

The weigher asks which hosts export a map version that reads from the
bases of an image (:meth:`vmar_openstack.db.hosts.HostReports.shares`):
map versions by target, then host exports by image and version. Without
these indexes both were whole-table scans, a cost that grows with hosts
and images (issue 35, ``bench/bench_scale.py hosts``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_vmar_map_targets_target_id', 'vmar_map_targets',
                    ['target_id'])
    op.create_index('ix_vmar_host_exports_image_id', 'vmar_host_exports',
                    ['image_id', 'map_version'])
