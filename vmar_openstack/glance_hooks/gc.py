"""Removing the map versions no compute host holds any more.

A map version stays, in the library's map directory and as a hidden image
in Glance, while any of these holds:

* it is its image's current version;
* it was superseded less than ``min_age`` ago;
* a host's last report lists it (an instance there reads it);
* a host has not reported since the version was superseded, so its
  report may not show an export of it made just before.

The map versions of a deleted image that hosts exported when it was
deleted stay in Glance (not in the library: its records went with it)
while a host's last report lists them: a server of the image moving to
another host fetches its map there, and its blocks from the hosts that
hold them (doc/source/admin/peers.rst). Once no report does, they go.

The digest list of a deleted image stays while a remaining version of
another image's map reads from it (hosts fill mirrors of the deleted base
from the images that hold its blocks, and check them against it), or
while a map version of the image itself stays.

Hosts report through :mod:`vmar_openstack.db.hosts`; a host that never
reported holds nothing, and one that is down keeps its last report until
an operator forgets it (``vmar-manage hosts forget``).
"""

import collections
import datetime

from oslo_log import log as logging

from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import models

LOG = logging.getLogger(__name__)

Plan = collections.namedtuple('Plan', 'deletable kept')


def plan(conf, library, min_age, now=None):
    """Which superseded versions may go.

    Returns a :class:`Plan`: ``deletable``, a list of
    :class:`~vmar_openstack.db.store.Superseded`, and ``kept``, a dict
    ``(image_id, version) -> why``.
    """
    now = now or models.utcnow()
    hosts = db_hosts.HostReports(conf).list()
    holders = collections.defaultdict(list)
    for h in hosts:
        for e in h.exports:
            holders[e].append(h.host)
    deletable, kept = [], {}
    for sv in library.superseded():
        key = (sv.image_id, sv.version)
        late = [h.host for h in hosts if h.reported_at <= sv.superseded_at]
        if now - sv.superseded_at < datetime.timedelta(seconds=min_age):
            kept[key] = 'superseded less than %ds ago' % min_age
        elif holders[key]:
            kept[key] = 'held by %s' % ', '.join(sorted(holders[key]))
        elif late:
            kept[key] = ('%s did not report since it was superseded'
                         % ', '.join(sorted(late)))
        else:
            deletable.append(sv)
    return Plan(deletable, kept)


def collect(conf, library, publisher, min_age, dry_run=False):
    """Delete what :func:`plan` allows; returns the plan.

    The Glance map image goes first, then the record and the file: a
    failure leaves the version recorded, and the next pass retries it.
    """
    p = plan(conf, library, min_age)
    for sv in p.deletable if not dry_run else ():
        publisher.delete_version(sv.image_id, sv.version)
        library.drop_map_version(sv.image_id, sv.version)
        LOG.info('deleted map v%d of %s: no host holds it', sv.version,
                 sv.image_id)
    if not dry_run:
        hidden = publisher.hidden_images()
        kept = _collect_maps_of_deleted(conf, library, publisher, hidden)
        _collect_digests(library, publisher, kept, hidden)
        # the library's own digest list objects no image names
        library.collect_digest_lists(min_age)
    return p


def _collect_maps_of_deleted(conf, library, publisher, hidden=None):
    """Delete the kept maps of deleted images no host lists any more.

    Returns the image ids whose maps stay.
    """
    held = db_hosts.HostReports(conf).exported()
    kept = set()
    for (image_id, version), _gid in sorted(
            publisher.maps_of_deleted(library.has_image, hidden).items()):
        if (image_id, version) in held:
            kept.add(image_id)
            continue
        publisher.delete_version(image_id, version)
        LOG.info('deleted map v%d of the deleted image %s: no host holds '
                 'it', version, image_id)
    return kept


def _collect_digests(library, publisher, kept=(), hidden=None):
    """Delete the digest lists of deleted images no map reads any more.

    ``kept``: deleted images a map version of which stays (it reads its
    own image's blocks, checked against its digest list).
    """
    read = set(kept)
    for sv in library.superseded():
        read |= library.bases_of(sv.image_id, sv.version)
    for base_id, did in sorted(publisher.digest_lists(hidden).items()):
        if base_id not in read and not library.has_image(base_id):
            publisher.delete_digests(base_id)
            LOG.info('deleted digest list %s of the deleted image %s: no '
                     'map reads from it', did, base_id)
