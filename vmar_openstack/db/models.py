"""SQLAlchemy models of the cluster tables.

* ``vmar_images``: one row per ingested image. ``seq`` is the monotonically
  increasing sequence id that decides the canonical order.
* ``vmar_image_digests``: digest lists of before revision 0023, until
  ``vmar-manage db sync`` moves them into objects of their own
  (vmar_openstack.db.digest_lists); ``vmar_images`` names each image's.
* ``vmar_fingerprints``: one row per distinct fingerprint key in the library,
  naming the cluster it belongs to.
* ``vmar_fingerprints_recent``: the small second tier of that table, where
  the new keys of small adds go until it is merged (vmar_openstack.db.bulk).
  A key is in one of the two, never both.
* ``vmar_fingerprint_runs``: the new keys of each add as sorted blobs (a
  run, in pieces), until a compaction outside the library lock writes them
  into the row tiers; ``vmar_fingerprint_overrides``: keys moved or gone
  since their row or run was written (vmar_openstack.db.bulk).
* ``vmar_clusters``: a cluster is a set of images; it holds the fingerprints
  found in exactly those images (paper Fig. 4-5). The row keeps the member
  list itself (adding a member appends to it: one row written, where a
  member table inserted into one b-tree position per cluster), its
  smallest member and its smallest public member, so that map generation
  rarely reads member lists.
* ``vmar_cluster_shadows``: images that hold keys of a cluster without
  being its members, because a public member before them holds the same
  keys: no map ever reads them there (vmar_openstack.db.store, "Shadow
  holders").
* ``vmar_maps``: every map version written, with its checksum;
  ``vmar_map_targets``: how many blocks each version reads from each of
  its targets.
* ``vmar_hosts``, ``vmar_host_exports``, ``vmar_host_bases``: the last
  report of each compute host, the map versions it exports and the blocks
  it holds of each base (vmar_openstack.db.hosts).
* ``vmar_publications``: the hidden Glance images vmar-agent publishes,
  each claimed by one publisher at a time (vmar_openstack.db.publications).
* ``vmar_locks``: the row that serialises library mutations, with a count
  of the mutations committed so far; ``vmar_compaction``: the row through
  which compactions of the fingerprint index take turns.
"""

import dataclasses
import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy import orm

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
# MariaDB's TEXT holds 64 KiB: about 10000 members
MembersText = sa.Text().with_variant(mysql.MEDIUMTEXT(), 'mysql', 'mariadb')


def as_dataclass(cls, row):
    """The dataclass ``cls`` of a row: its fields, read from the row."""
    return cls(**{f.name: getattr(row, f.name)
                  for f in dataclasses.fields(cls)})


def utcnow():
    """Now, in UTC without a time zone: how every time column is kept."""
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


class Base(orm.DeclarativeBase):
    pass


class Image(Base):
    __tablename__ = 'vmar_images'

    __table_args__ = (sa.Index('ix_vmar_images_owner', 'owner'),
                      {'sqlite_autoincrement': True})

    seq = sa.Column(BigInt, primary_key=True, autoincrement=True)
    image_id = sa.Column(sa.String(36), nullable=False, unique=True)
    owner = sa.Column(sa.String(255))
    visibility = sa.Column(sa.String(16), nullable=False)
    disk_format = sa.Column(sa.String(16), nullable=False)
    virtual_size = sa.Column(sa.BigInteger, nullable=False)
    block_size = sa.Column(sa.Integer, nullable=False)
    algorithm = sa.Column(sa.String(32), nullable=False)
    space_key = sa.Column(sa.BigInteger, nullable=False)
    state = sa.Column(sa.String(16), nullable=False)
    n_blocks = sa.Column(sa.BigInteger, nullable=False)
    zero_blocks = sa.Column(sa.BigInteger, nullable=False)
    content_sha256 = sa.Column(sa.String(64), nullable=False)
    map_version = sa.Column(sa.Integer, nullable=False, default=0)
    redirected_blocks = sa.Column(sa.BigInteger, nullable=False, default=0)
    n_extents = sa.Column(sa.BigInteger, nullable=False, default=0)
    # the image's digest list, an object of its own (db/digest_lists.py):
    # its SHA-256 and where it is; NULL while the list is still in
    # vmar_image_digests (a library of before 0023 not yet moved)
    digests_sha256 = sa.Column(sa.String(64))
    digests_location = sa.Column(sa.String(255))
    created_at = sa.Column(sa.DateTime, nullable=False, default=utcnow)
    updated_at = sa.Column(sa.DateTime, nullable=False, default=utcnow,
                           onupdate=utcnow)


class ImageDigests(Base):
    """Digest lists of before revision 0023, until they are moved out.

    ``vmar-manage db sync`` moves each into an object of its own
    (db/digest_lists.py); nothing writes here any more.
    """
    __tablename__ = 'vmar_image_digests'

    seq = sa.Column(BigInt, sa.ForeignKey('vmar_images.seq',
                                          ondelete='CASCADE'),
                    primary_key=True)
    chunk = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    data = sa.Column(sa.LargeBinary(length=2 ** 32 - 1), nullable=False)


class Fingerprint(Base):
    __tablename__ = 'vmar_fingerprints'

    fp_key = sa.Column(BigInt, primary_key=True, autoincrement=False)
    # no index: every lookup goes by key; no foreign key: checking it cost
    # a quarter of every insert and move (doc/source/reference/design.rst)
    cluster_id = sa.Column(BigInt, nullable=False)


class RecentFingerprint(Base):
    __tablename__ = 'vmar_fingerprints_recent'

    fp_key = sa.Column(BigInt, primary_key=True, autoincrement=False)
    cluster_id = sa.Column(BigInt, nullable=False)


class FingerprintRun(Base):
    """A piece of the new keys of one add, in one cluster, as a blob.

    An add's new keys, sorted, cut in pieces of at most
    :data:`vmar_openstack.db.bulk.COMPACT_KEYS`: ``piece`` counts from 0
    in key order, ``key_blob`` holds the piece's ``n_keys`` keys as
    little-endian int64s, ascending. A compaction writes a whole piece
    into the row tiers and deletes its row in one transaction, so no row
    of a run is ever updated (a Galera row event of an update carries the
    blob twice). ``id``: the content generation of the add, shifted left
    by :data:`vmar_openstack.db.bulk.RUN_BITS`, plus the run's place in
    its transaction: ids grow with time (vmar_openstack.db.bulk).
    """
    __tablename__ = 'vmar_fingerprint_runs'

    id = sa.Column(sa.BigInteger, primary_key=True, autoincrement=False)
    piece = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    cluster_id = sa.Column(sa.BigInteger, nullable=False)
    n_keys = sa.Column(sa.Integer, nullable=False)
    key_blob = sa.Column(sa.LargeBinary(length=2 ** 32 - 1),
                         nullable=False)


class FingerprintOverride(Base):
    """A key moved to another cluster, or gone, since its row was written.

    ``cluster_id`` 0: the key is gone from the row tiers and from every
    run whose id is below ``hides``; otherwise it is in that cluster,
    whatever the tiers and the runs say (vmar_openstack.db.bulk).
    """
    __tablename__ = 'vmar_fingerprint_overrides'

    fp_key = sa.Column(BigInt, primary_key=True, autoincrement=False)
    cluster_id = sa.Column(sa.BigInteger, nullable=False)
    hides = sa.Column(sa.BigInteger, nullable=False)


class Cluster(Base):
    __tablename__ = 'vmar_clusters'
    __table_args__ = {'sqlite_autoincrement': True}

    id = sa.Column(BigInt, primary_key=True, autoincrement=True)
    members_hash = sa.Column(sa.String(64), nullable=False, unique=True)
    n_images = sa.Column(sa.Integer, nullable=False)
    n_fingerprints = sa.Column(sa.BigInteger, nullable=False)
    # the smallest member, and the smallest public member (NULL: none):
    # map generation finds canonical targets from them (mapgen)
    min_seq = sa.Column(sa.BigInteger, nullable=False)
    min_public_seq = sa.Column(sa.BigInteger)
    # the member seqs: those of the base set (NULL: none), plus added,
    # minus removed, each ascending runs, comma-separated: 1-57,59,61-200
    # (vmar_openstack.db.members)
    base_id = sa.Column(BigInt, index=True)
    added = sa.Column(sa.Text, nullable=False, default='')
    removed = sa.Column(sa.Text, nullable=False, default='')


class MemberBase(Base):
    """A member set clusters share, immutable once written.

    Keyed by the set's members hash, so a set folded twice is kept once;
    it goes when no cluster uses it any more.
    """
    __tablename__ = 'vmar_member_bases'
    __table_args__ = {'sqlite_autoincrement': True}

    id = sa.Column(BigInt, primary_key=True, autoincrement=True)
    members_hash = sa.Column(sa.String(64), nullable=False, unique=True)
    members = sa.Column(MembersText, nullable=False)


class ClusterShadow(Base):
    """An image holding keys of a cluster, not one of its members.

    A public member of the cluster comes before it: every image that may
    read it may read that member, whose sequence id is smaller, so no map
    reads the shadow's copy of these keys. The image joins the cluster
    (and may split it) only once no such member is left. Which of the
    cluster's keys it holds is in its digest list.
    """
    __tablename__ = 'vmar_cluster_shadows'
    __table_args__ = (sa.Index('ix_vmar_cluster_shadows_seq', 'seq'),)

    cluster_id = sa.Column(BigInt, primary_key=True, autoincrement=False)
    seq = sa.Column(BigInt, primary_key=True, autoincrement=False)


class PendingMap(Base):
    """An image whose current map is to be rewritten by vmar-agent.

    Left by a change of another image (``cause``) that rewrote only
    ``[vmar] rewrite_at_once`` maps itself.
    """
    __tablename__ = 'vmar_pending_maps'

    seq = sa.Column(BigInt, sa.ForeignKey('vmar_images.seq',
                                          ondelete='CASCADE'),
                    primary_key=True)
    cause = sa.Column(sa.String(36), nullable=False)
    since = sa.Column(sa.DateTime, nullable=False, default=utcnow)


class MapVersion(Base):
    __tablename__ = 'vmar_maps'

    seq = sa.Column(BigInt, sa.ForeignKey('vmar_images.seq',
                                          ondelete='CASCADE'),
                    primary_key=True)
    version = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    sha256 = sa.Column(sa.String(64), nullable=False)
    size = sa.Column(sa.BigInteger, nullable=False)
    n_extents = sa.Column(sa.BigInteger, nullable=False)
    created_at = sa.Column(sa.DateTime, nullable=False, default=utcnow)


class MapTarget(Base):
    """How many blocks a map version reads from one of its targets."""
    __tablename__ = 'vmar_map_targets'
    # which map versions read from a base (the weigher, 0013)
    __table_args__ = (sa.Index('ix_vmar_map_targets_target_id',
                               'target_id'),)

    seq = sa.Column(BigInt, sa.ForeignKey('vmar_images.seq',
                                          ondelete='CASCADE'),
                    primary_key=True)
    version = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    target_id = sa.Column(sa.String(36), primary_key=True)
    blocks = sa.Column(sa.BigInteger, nullable=False)


class AgentFailure(Base):
    """An image vmar-agent could not process (yet): retries and the cause."""
    __tablename__ = 'vmar_agent_failures'

    image_id = sa.Column(sa.String(36), primary_key=True)
    event = sa.Column(sa.String(64), nullable=False)
    attempts = sa.Column(sa.Integer, nullable=False, default=0)
    # no longer retried on redelivery: given up ('image'), or parked until
    # the outage is over ('outage')
    permanent = sa.Column(sa.Boolean, nullable=False, default=False)
    cause = sa.Column(sa.String(8), nullable=False, default='outage',
                      server_default='outage')
    last_error = sa.Column(sa.Text, nullable=False, default='')
    updated_at = sa.Column(sa.DateTime, nullable=False, default=utcnow,
                           onupdate=utcnow)


class HostReport(Base):
    """The last report of a compute host: when the agent received it."""
    __tablename__ = 'vmar_hosts'

    host = sa.Column(sa.String(255), primary_key=True)
    reported_at = sa.Column(sa.DateTime, nullable=False, default=utcnow)
    # its peer server, "host:port" (None: it serves no peer), and its
    # one-minute load average per CPU at the report
    peer_address = sa.Column(sa.String(255), nullable=True)
    load_per_cpu = sa.Column(sa.Float, nullable=True)
    # which report of the host's vmar-export this was: its run (a random
    # id per start) and the report's number in it. Agents record reports
    # concurrently; one of the same run with a lower number is older and
    # is not recorded over this one (0020; None: a host of before)
    report_run = sa.Column(sa.String(36), nullable=True)
    report_seq = sa.Column(sa.BigInteger, nullable=True)
    # what the rows of the report last written say, and the library's
    # maps epoch then (db.hosts._digest): a report that says the same
    # under the same epoch only moves the time and order above (0021)
    report_digest = sa.Column(sa.String(64), nullable=True)


class HostExport(Base):
    """A map version a host exported at its last report."""
    __tablename__ = 'vmar_host_exports'
    # the hosts exporting a map version (the weigher, 0013)
    __table_args__ = (sa.Index('ix_vmar_host_exports_image_id',
                               'image_id', 'map_version'),)

    host = sa.Column(sa.String(255), sa.ForeignKey(
        'vmar_hosts.host', ondelete='CASCADE'), primary_key=True)
    image_id = sa.Column(sa.String(36), primary_key=True)
    map_version = sa.Column(sa.Integer, primary_key=True,
                            autoincrement=False)


class HostBase(Base):
    """The blocks of a base a host held at its last report.

    ``blocks`` is None for a whole copy of the base, else the number of
    blocks its mirror holds; ``complete``: the mirror holds every block
    the host's exported map versions of the base's own image read from
    it (whole copies are complete by themselves).
    """
    __tablename__ = 'vmar_host_bases'
    # the weigher looks a base's holders up
    __table_args__ = (sa.Index('ix_vmar_host_bases_base_id', 'base_id'),)

    host = sa.Column(sa.String(255), sa.ForeignKey(
        'vmar_hosts.host', ondelete='CASCADE'), primary_key=True)
    base_id = sa.Column(sa.String(36), primary_key=True)
    blocks = sa.Column(sa.BigInteger, nullable=True)
    complete = sa.Column(sa.Boolean, nullable=False, default=False,
                         server_default=sa.false())


class FetchLead(Base):
    """A host's place in a burst of a base (0017).

    Hosts take places in the order they ask for the holders of a base,
    from the first one, who asked when nobody held any of it: for
    ``[vmar_agent] fetch_lead_seconds`` from then, each waits a moment for
    the runs of the host at the place its own leads to
    (:meth:`vmar_openstack.db.hosts.HostReports.lead`).
    """
    __tablename__ = 'vmar_fetch_leads'
    __table_args__ = (sa.UniqueConstraint('base_id', 'host'),)

    base_id = sa.Column(sa.String(36), primary_key=True)
    seq = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    host = sa.Column(sa.String(255), nullable=False)
    since = sa.Column(sa.DateTime, nullable=False, default=utcnow)


class HostShare(Base):
    """How much of a base's canonical blocks a host holds, for the weigher.

    Written with each report from its bases and exports
    (:meth:`vmar_openstack.db.hosts.HostReports.record`): the larger of
    what its copy or mirror of the base holds and what its exported map
    versions read from it, as a fraction of the base's canonical blocks
    (0 to 1). Derived data: the next report rewrites it.
    """
    __tablename__ = 'vmar_host_shares'
    # each base's holders from the index alone (the weigher, 0019)
    __table_args__ = (sa.Index('ix_vmar_host_shares_base_id_host_share',
                               'base_id', 'host', 'share'),)

    host = sa.Column(sa.String(255), sa.ForeignKey(
        'vmar_hosts.host', ondelete='CASCADE'), primary_key=True)
    base_id = sa.Column(sa.String(36), primary_key=True)
    share = sa.Column(sa.Float, nullable=False)


class Publication(Base):
    """A hidden Glance image of the library's, and who is publishing it.

    One row per hidden image vmar-agent publishes (a map version, a digest
    list, a boot working set, a block layout): publishers across agents
    take turns per image through its row (:mod:`vmar_openstack.db.
    publications`), never through the library lock, so a publish neither
    waits for an ingest nor counts in the lock row's generation. A claim
    not finished within its timeout (its agent was killed) is taken over;
    the agent's resync finishes the unfinished ones.
    """
    __tablename__ = 'vmar_publications'

    object_id = sa.Column(sa.String(36), primary_key=True)
    image_id = sa.Column(sa.String(36), nullable=False, index=True)
    what = sa.Column(sa.String(32), nullable=False)
    sha256 = sa.Column(sa.String(64), nullable=False)
    # 'claimed' (an upload under way, by holder) or 'done' (active in
    # Glance with that SHA-256)
    state = sa.Column(sa.String(8), nullable=False)
    holder = sa.Column(sa.String(255), nullable=False, default='')
    claimed_at = sa.Column(sa.DateTime, nullable=False, default=utcnow)


class Lock(Base):
    __tablename__ = 'vmar_locks'

    name = sa.Column(sa.String(64), primary_key=True)
    # committed library mutations (see session.locked_writer)
    generation = sa.Column(sa.BigInteger, nullable=False, default=0)
    # changes to what hosts' shares are computed from: a map version
    # replaced or forgotten, an image deleted (session.maps_changed)
    maps_epoch = sa.Column(sa.BigInteger, nullable=False, default=0,
                           server_default='0')
    # committed mutations that changed the clusters: an add, an update, a
    # delete (session.locked_writer(content=True), db.content_log)
    content_generation = sa.Column(sa.BigInteger, nullable=False,
                                   default=0, server_default='0')


class CompactionTurn(Base):
    """The one row compactions take turns through (db.bulk).

    Not a row of ``vmar_locks``: PostgreSQL's locked transactions lock
    that table whole (db.session), and a compaction never waits for them.
    """
    __tablename__ = 'vmar_compaction'

    id = sa.Column(sa.Integer, primary_key=True, autoincrement=False)
    # compaction transactions committed so far
    turn = sa.Column(sa.BigInteger, nullable=False)


class ContentChange(Base):
    """What one locked mutation changed in the clusters, kept a while.

    One row per committed content generation (:mod:`vmar_openstack.db.
    content_log`). ``kind`` ``'add'``: ``key_filter`` is a
    :class:`~vmar_openstack.fingerprint.keyfilter.KeyFilter` of the keys
    the add inserted, ``clusters`` the sorted int64 ids of the clusters
    it joined or split (its found keys' clusters before it). ``'other'``
    (an update, a delete): no detail; an ingest whose snapshot is older
    looks everything up again.
    """
    __tablename__ = 'vmar_content_log'

    generation = sa.Column(sa.BigInteger, primary_key=True,
                           autoincrement=False)
    kind = sa.Column(sa.String(8), nullable=False)
    created_at = sa.Column(sa.DateTime, nullable=False, default=utcnow,
                           index=True)
    key_filter = sa.Column(sa.LargeBinary(length=2 ** 32 - 1))
    moved_filter = sa.Column(sa.LargeBinary(length=2 ** 32 - 1))
    clusters = sa.Column(sa.LargeBinary(length=2 ** 32 - 1))
