"""The cluster tables behind one object (the VMAR paper, Fig. 4-7).

A :class:`ClusterStore` wraps one session. It owns the fingerprint table
(both tiers, :mod:`.bulk`), the cluster rows (:class:`ClusterRow`, with
their member sets: deltas against shared bases, :mod:`.members`), the
images' digest lists and the maps left pending; callers outside this
package reach the tables only through it, and never see SQL.

Shadow holders: an image that holds keys of a cluster after a public
member of it (every image that may read the image may read that member,
whose sequence id is smaller) is not made a member: it is recorded as a
shadow holder of the cluster (``vmar_cluster_shadows``), and the cluster
neither changes nor splits. No map reads a shadow's copy of those keys
while such a member is there. When the cluster's smallest public member
leaves (a delete, new content, the image made private), the shadows it
covered are read in order and made members where no public member before
them is left (:meth:`ClusterStore._recover`). Without them every snapshot
of an image split its parent's clusters, and an add touched more clusters
the more snapshots the library held (issue 35).

The fingerprint table is keyed by fingerprint keys
(:mod:`vmar_openstack.fingerprint.keys`). Full digests live in each image's
digest list and are compared whenever a map is built, so two digests that
share a key (by accident or by a crafted collision) never redirect a read
to different content: they only share a cluster row.

The mutating methods expect a session of :func:`session.locked_writer`.
"""

import typing

import numpy as np
import sqlalchemy as sa

from vmar_openstack.db import api as db_api
from vmar_openstack.db import bulk
from vmar_openstack.db import content_log
from vmar_openstack.db import digest_lists
from vmar_openstack.db import members as db_members
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys


class Superseded(typing.NamedTuple):
    """A map version a newer one replaced (at ``superseded_at``)."""
    image_id: str
    version: int
    superseded_at: object      # datetime, naive UTC


# A split is flipped (see _flips) when it saves this many key moves, and
# only if it costs at most this many lookups, and reads the digests of
# members of at most this many blocks, per move saved. The keys outside
# the image are sought among those of up to FLIP_MEMBERS members.
FLIP_MIN_SAVING = 256
FLIP_LOOKUPS_PER_MOVE = 2
FLIP_BLOCKS_PER_MOVE = 64
FLIP_MEMBERS = 3


class ClusterRow(typing.NamedTuple):
    """A row of vmar_clusters."""

    id: int
    members_hash: str
    n_images: int
    n_fingerprints: int
    min_seq: int
    min_public_seq: typing.Optional[int]
    base_id: typing.Optional[int]     # vmar_member_bases; None: empty
    added: str
    removed: str


class Pending(typing.NamedTuple):
    """A map left for vmar-agent to rewrite (``pending_maps``)."""

    seq: int
    image_id: str
    cause: str         # the image whose change made it stale
    since: object      # datetime, naive UTC


class Holders(typing.NamedTuple):
    """Which keys of one image other images hold (``holders_of``)."""

    keys: object       # the image's sorted distinct keys, int64
    held: dict         # (seq, digests_sha256) -> packed bits over keys


def _smaller(a, b):
    """min() where None means "none"."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def group_by_cluster(keys, clusters):
    """``keys`` ordered by cluster, and ``{cluster id: (lo, hi)}``.

    Each cluster's keys are ``keys[lo:hi]`` of the keys returned, in the
    order they came within the cluster. Per key, and so made before the
    library lock where it can be (``add_keys`` ``grouped``).
    """
    order = fp_keys.stable_order(clusters)
    keys, clusters = keys[order], clusters[order]
    starts = np.concatenate([np.zeros(min(1, len(keys)), np.int64),
                             np.flatnonzero(np.diff(clusters)) + 1])
    ends = np.append(starts[1:], len(keys))
    return keys, dict(zip(clusters[starts].tolist(),
                          zip(starts.tolist(), ends.tolist())))


class ClusterStore:
    """The library's tables, as one transaction (``session``) sees them."""

    def __init__(self, session):
        self.session = session
        self.lists = digest_lists.DigestLists(
            db_session.library_conf(session))
        self._sql = bulk.BulkSQL(session)
        self.dialect = self._sql.dialect
        self._bases = {}       # base id -> members text (immutable rows)
        self._orphans = set()  # base ids a cluster may have stopped using
        # what add_keys inserted and joined: (new keys, old cluster ids)
        self._added = None
        # which keys of a leaving image its shadows hold (holders_of)
        self._holders = None

    def flush(self):
        self.session.flush()

    def generation(self):
        """Library mutations committed before this transaction.

        In a :func:`session.locked_writer`, the count it found when it took
        the lock (before its own increment).
        """
        value = self.session.info.get('vmar_generation')
        if value is None:
            value = db_session.generation(self.session)
        return value

    def content_generation(self):
        """Committed changes of the clusters before this transaction.

        In a :func:`session.locked_writer`, the count it found when it took
        the lock (before its own increment, if it counts).
        """
        value = self.session.info.get('vmar_content_generation')
        if value is None:
            value = db_session.content_generation(self.session)
        return value

    def content_changes(self, since):
        """The changes committed after content generation ``since``.

        A :class:`~vmar_openstack.db.content_log.Changes` of those before
        this transaction; None if the log cannot tell.
        """
        return content_log.since(self.session, since,
                                 self.content_generation())

    def only_adds_since(self, since):
        """Whether each change after generation ``since`` was an add.

        Those this transaction sees; False if the log no longer holds one.
        """
        return content_log.only_adds(self.session, since,
                                     self.content_generation())

    def log_content_change(self, add):
        """Log this transaction's change of the clusters (before commit).

        ``add``: the transaction added one image, and changed the clusters
        only through its :meth:`add_keys`; else it is logged as one the
        log gives no detail of.
        """
        conf = db_session.library_conf(self.session)
        generation = self.content_generation() + 1
        keep = conf.vmar.content_log_seconds
        if add:
            if self._added is None:
                raise RuntimeError('an add logged before its add_keys')
            new, clusters, new_filter = self._added
            moved = np.concatenate([np.empty(0, np.int64)] + self._sql.moved)
            content_log.record(self.session, generation, content_log.ADD,
                               new, moved, clusters, keep,
                               new_filter=new_filter)
        else:
            content_log.record(self.session, generation, content_log.OTHER,
                               keep_seconds=keep)

    # -- images --------------------------------------------------------------

    def get_image(self, image_id):
        return db_api.get_image(self.session, image_id)

    def images_by_seq(self, seqs):
        return db_api.images_by_seq(self.session, seqs)

    def image_rows(self):
        return db_api.image_rows(self.session)

    def public_seqs(self, seqs):
        """Those of image ``seqs`` that are public, as a set."""
        img = models.Image
        seqs = sorted({int(x) for x in seqs})
        out = set()
        for i in range(0, len(seqs), 500):
            out.update(self.session.execute(sa.select(img.seq).where(
                img.seq.in_(seqs[i:i + 500]),
                img.visibility == 'public')).scalars())
        return out

    def private_seqs(self, image, below):
        """Seqs of the owner's other images ``image`` may read, < ``below``.

        Those that are not public, in its key space and active, ascending
        int64: what ``project`` scope adds to the public images
        (:func:`vmar_openstack.mapgen.may_redirect`). Through the owner's
        index: a map reads its owner's images, never the library's.
        """
        img = models.Image
        return np.array(self.session.execute(
            sa.select(img.seq).where(
                img.owner == image.owner, img.visibility != 'public',
                img.seq < below, img.state == 'active',
                img.space_key == image.space_key,
                img.algorithm == image.algorithm,
                img.block_size == image.block_size)
            .order_by(img.seq)).scalars().all(), dtype=np.int64)

    def list_images(self):
        return db_api.list_images(self.session)

    def add_image(self, **columns):
        """A new image row; its ``seq`` is set once this returns."""
        img = models.Image(**columns)
        self.session.add(img)
        self.session.flush()
        return img

    def delete_image(self, img):
        """Remove an image's row, digest list and map versions.

        Returns the versions its map files had.
        """
        versions = self.session.execute(
            sa.select(models.MapVersion.version)
            .where(models.MapVersion.seq == img.seq)).scalars().all()
        self.session.execute(sa.delete(models.MapTarget).where(
            models.MapTarget.seq == img.seq))
        self.session.execute(sa.delete(models.MapVersion).where(
            models.MapVersion.seq == img.seq))
        self.session.execute(sa.delete(models.ImageDigests).where(
            models.ImageDigests.seq == img.seq))
        self.clear_pending([img.seq])
        self.session.delete(img)
        db_session.maps_changed(self.session)
        self.session.flush()
        return versions

    def recorded_map_versions(self, pairs):
        """Those of ``(image id, version)`` pairs a map version records."""
        want = set(pairs)
        ids = sorted({i for i, _v in want})
        out = set()
        mv, img = models.MapVersion, models.Image
        for i in range(0, len(ids), 500):
            out.update((r.image_id, r.version) for r in self.session.execute(
                sa.select(img.image_id, mv.version)
                .join(img, img.seq == mv.seq)
                .where(img.image_id.in_(ids[i:i + 500]))))
        return out & want

    def map_version(self, seq, version):
        """The map version row of image ``seq``, or None."""
        return self.session.get(models.MapVersion, (seq, version))

    def superseded_map_versions(self):
        """Every map version that is not its image's current one.

        A list of :class:`Superseded`, with the time the next version of
        the image was recorded.
        """
        mv, img = models.MapVersion, models.Image
        rows = self.session.execute(
            sa.select(img.image_id, mv.version, mv.created_at,
                      img.map_version).join(img, img.seq == mv.seq)
            .order_by(img.image_id, mv.version)).all()
        out = []
        for prev, row in zip(rows, rows[1:]):
            if (prev.image_id == row.image_id
                    and prev.version < prev.map_version):
                out.append(Superseded(prev.image_id, prev.version,
                                      row.created_at))
        return out

    def delete_map_version(self, image_id, version):
        """Forget a map version that is not current; whether it was."""
        img = self.get_image(image_id)
        if img is None or version >= img.map_version:
            return False
        self.session.execute(sa.delete(models.MapTarget).where(
            models.MapTarget.seq == img.seq,
            models.MapTarget.version == version))
        gone = self.session.execute(sa.delete(models.MapVersion).where(
            models.MapVersion.seq == img.seq,
            models.MapVersion.version == version)).rowcount > 0
        if gone:
            db_session.maps_changed(self.session)
        return gone

    def record_map_version(self, seq, version, size, sha256, n_extents,
                           targets=()):
        """Record a map version written.

        ``targets``: ``[(target image id, blocks read from it)]``
        (:func:`vmar_openstack.mapformat.target_blocks`). A version after
        the first replaces the image's current map: a maps change.
        """
        self.session.add(models.MapVersion(
            seq=seq, version=version, size=size, sha256=sha256,
            n_extents=n_extents))
        self._add_targets(seq, version, targets)
        if version > 1:
            db_session.maps_changed(self.session)

    def map_versions_without_targets(self):
        """``[(seq, image id, version)]`` of current maps lacking counts.

        Maps written before revision 0010 (per-target block counts).
        """
        img, mt = models.Image, models.MapTarget
        has = sa.select(mt.seq).where(mt.seq == img.seq,
                                      mt.version == img.map_version)
        return [tuple(r) for r in self.session.execute(
            sa.select(img.seq, img.image_id, img.map_version)
            .where(img.map_version > 0, ~has.exists())
            .order_by(img.seq)).all()]

    def record_map_targets(self, seq, version, targets):
        """The per-target counts of a map version recorded without them."""
        self._add_targets(seq, version, targets)
        db_session.maps_changed(self.session)

    def _add_targets(self, seq, version, targets):
        self.session.add_all(models.MapTarget(
            seq=seq, version=version, target_id=t, blocks=n)
            for t, n in targets if n)

    # -- maps left for the agent ----------------------------------------------

    def pend_maps(self, seqs, cause):
        """Leave the maps of images ``seqs`` for vmar-agent to rewrite.

        ``cause``: the image whose change made them stale. A map pending
        already keeps its first cause and time.
        """
        have = self.pending_among(seqs)
        self.session.add_all(models.PendingMap(seq=s, cause=cause)
                             for s in sorted(set(seqs)) if s not in have)

    def clear_pending(self, seqs):
        seqs = sorted(set(seqs))
        for i in range(0, len(seqs), 500):
            self.session.execute(sa.delete(models.PendingMap).where(
                models.PendingMap.seq.in_(seqs[i:i + 500])))

    def pending_maps(self, limit=None, among=None):
        """The :class:`Pending` maps, oldest first.

        The maps of images some compute host exports first. ``among``:
        those of these image seqs only.
        """
        pm, img = models.PendingMap, models.Image
        exported = sa.exists().where(
            models.HostExport.image_id == img.image_id)
        q = (sa.select(pm.seq, img.image_id, pm.cause, pm.since)
             .join(img, img.seq == pm.seq)
             .order_by(sa.case((exported, 0), else_=1), pm.since, pm.seq))
        if among is not None:
            among = set(among)
        elif limit is not None:
            q = q.limit(limit)
        rows = [Pending(r.seq, r.image_id, r.cause, r.since)
                for r in self.session.execute(q)
                if among is None or r.seq in among]
        return rows if limit is None else rows[:limit]

    def pending_among(self, seqs):
        """Those of image ``seqs`` whose maps are pending."""
        pm = models.PendingMap
        seqs = sorted(set(seqs))
        out = set()
        for i in range(0, len(seqs), 500):
            out.update(self.session.execute(sa.select(pm.seq).where(
                pm.seq.in_(seqs[i:i + 500]))).scalars())
        return out

    def pending_count(self):
        return self.session.execute(sa.select(sa.func.count()).select_from(
            models.PendingMap)).scalar()

    # -- digest lists --------------------------------------------------------

    def record_digests(self, image, ref):
        """Name ``image``'s digest list: ``ref`` is ``(sha256, location)``.

        The object is stored already (:meth:`DigestLists.put`, before the
        lock, and :meth:`DigestLists.ensure`). One the image named before
        stays until the map GC collects it.
        """
        image.digests_sha256, image.digests_location = ref
        # a list of before revision 0023 goes with its replacement
        self.session.execute(sa.delete(models.ImageDigests).where(
            models.ImageDigests.seq == image.seq))

    def digest_locations(self):
        """The digest list objects the library's images name."""
        img = models.Image
        return set(self.session.execute(sa.select(
            img.digests_location).where(
                img.digests_location.is_not(None)).distinct()).scalars())

    def load_digests(self, image):
        """The digest list of ``image``, ``(n_blocks, digest size)`` uint8.

        Read-only: the array may be shared with other readers (the
        digest list cache).
        """
        dsize = fingerprint.DIGEST_SIZES[image.algorithm]
        if image.digests_location is not None:
            return self.lists.load(image.image_id, image.digests_sha256,
                                   image.digests_location, image.n_blocks,
                                   dsize)
        raw = self.unmoved_digests(image.seq)
        if len(raw) != image.n_blocks * dsize:
            raise exception.LibraryInconsistent(
                what='digest list of image %s has %d bytes, expected %d'
                % (image.image_id, len(raw), image.n_blocks * dsize))
        return np.frombuffer(raw, dtype=np.uint8).reshape(image.n_blocks,
                                                          dsize)

    def unmoved_digests(self, seq):
        """The bytes of an image's list of before revision 0023, if any."""
        return b''.join(self.session.execute(
            sa.select(models.ImageDigests.data)
            .where(models.ImageDigests.seq == seq)
            .order_by(models.ImageDigests.chunk)).scalars().all())

    def images_to_move(self, limit):
        """Up to ``limit`` images whose lists are still in the tables."""
        img = models.Image
        return self.session.execute(
            sa.select(img).where(img.digests_location.is_(None))
            .order_by(img.seq).limit(limit)).scalars().all()

    def moved_digests(self, seq, ref):
        """Name the object of a list moved out; whether this moved it.

        Not in a locked transaction: only the image's own row and list
        change, and nothing else, if no one named one meanwhile (a new
        content's list, written under the lock).
        """
        img = models.Image
        done = self.session.execute(
            sa.update(img).where(img.seq == seq,
                                 img.digests_location.is_(None))
            .values(digests_sha256=ref[0], digests_location=ref[1])
            .execution_options(synchronize_session=False)).rowcount
        if done:
            self.session.execute(sa.delete(models.ImageDigests).where(
                models.ImageDigests.seq == seq))
        return bool(done)

    # -- fingerprint keys ----------------------------------------------------

    def lookup(self, keys):
        """(keys, cluster ids) of those of ``keys`` in the index.

        Sorted by key.
        """
        return self._sql.lookup(keys)

    def key_clusters(self, keys):
        """(keys, cluster ids) of the given distinct keys, sorted by key.

        Goes through the fingerprint table's primary key: the table has no
        index on ``cluster_id``, whose upkeep doubled the cost of every
        insert and move (see doc/source/reference/design.rst).
        """
        return self.lookup(keys)

    def scan_fingerprints(self):
        """Every (key, cluster) of both tiers, sorted by key."""
        return self._sql.scan_fingerprints()

    def count_fingerprints_at_most(self):
        """An upper bound of the fingerprint keys in the library."""
        return self._sql.count_fingerprints_at_most()

    def fingerprint_rows(self):
        """Every ``(key, cluster id)`` of the index, as lookups see it."""
        return list(zip(*(a.tolist() for a in self.fingerprint_index())))

    def fingerprint_index(self):
        """``(keys, cluster ids)`` of the index as lookups see it.

        int64 arrays, sorted by key: 16 bytes a key, where a list of
        pairs takes ten times that.
        """
        return self._sql.scan_fingerprints()

    def index_problems(self):
        """What breaks the fingerprint index's own rules, as sentences.

        A key in both row tiers; a key in a row tier and in a run without
        an override saying which holds (vmar_openstack.db.bulk).
        """
        problems = []
        (large, _c), (recent, _r) = self._sql.tier_rows()
        both = np.intersect1d(large, recent)
        if len(both):
            problems.append('%d fingerprint keys are in both tiers of the '
                            'fingerprint table' % len(both))
        overridden = self._sql.all_overrides()[0]
        rows = np.union1d(large, recent)
        for run in self._sql.runs():
            twice = np.setdiff1d(np.intersect1d(rows, run.keys), overridden)
            if len(twice):
                problems.append('%d fingerprint keys of run %d are also in '
                                'a row tier' % (len(twice), run.id))
        return problems

    def compact_step(self):
        """One transaction's share of the index's compaction.

        In a session of :func:`session.writer`. False: nothing was left.
        """
        return self._sql.compact_step()

    # -- clusters ------------------------------------------------------------

    def cluster_rows(self):
        """Every cluster, by id, as :class:`ClusterRow`."""
        return {r[0]: ClusterRow._make(r) for r in self.session.execute(
            sa.select(*(getattr(models.Cluster, c)
                        for c in ClusterRow._fields)))}

    def cluster_count(self):
        return self.session.execute(sa.select(sa.func.count()).select_from(
            models.Cluster)).scalar()

    def cluster_minima(self, cluster_ids):
        """The smallest member and smallest public member of clusters.

        Returns ``(ids, min_seq, min_public_seq)`` int64 arrays, in no
        particular order, -1 where a cluster has no public member; ids
        with no cluster row are left out.
        """
        return self._sql.lookup(
            cluster_ids, bulk.CLUSTERS, 'id',
            ('f.min_seq', 'COALESCE(f.min_public_seq, -1)'))

    def _base_texts(self, base_ids):
        """Map base id -> members text, for (at least) ``base_ids``.

        Bases never change once written: each is read once per store.
        """
        want = sorted({int(b) for b in base_ids if b is not None}
                      - set(self._bases))
        for i in range(0, len(want), 500):
            self._bases.update(self.session.execute(
                sa.select(models.MemberBase.id, models.MemberBase.members)
                .where(models.MemberBase.id.in_(want[i:i + 500]))).all())
        missing = [b for b in want if b not in self._bases]
        if missing:
            raise exception.LibraryInconsistent(
                what='clusters name member bases %s, which do not exist'
                % missing[:10])
        return self._bases

    def _resolve(self, rows):
        """Map cluster id -> member seqs, ascending int64, of ClusterRows."""
        rows = list(rows)
        bases = self._base_texts(r.base_id for r in rows)
        return {r.id: db_members.resolve(bases.get(r.base_id, ''), r.added,
                                         r.removed) for r in rows}

    def member_lists(self, cluster_ids):
        """Map cluster id -> its member seqs, ascending, as int64."""
        return self._resolve(self._cluster_info(cluster_ids).values())

    def cluster_members(self, cluster_ids):
        """Map cluster id -> frozenset of member image seqs."""
        return {cid: frozenset(m.tolist())
                for cid, m in self.member_lists(cluster_ids).items()}

    def member_bases(self):
        """Every member base: ``{id: (members hash, members text)}``."""
        return {r.id: (r.members_hash, r.members) for r in
                self.session.execute(sa.select(
                    models.MemberBase.id, models.MemberBase.members_hash,
                    models.MemberBase.members))}

    def _base_ids(self, hashes):
        out = {}
        hashes = list(hashes)
        for i in range(0, len(hashes), 500):
            out.update((h, bid) for bid, h in self.session.execute(
                sa.select(models.MemberBase.id,
                          models.MemberBase.members_hash)
                .where(models.MemberBase.members_hash.in_(
                    hashes[i:i + 500]))))
        return out

    def _fold(self, rows):
        """Fold the long deltas of new cluster states into bases.

        ``rows``: dicts with the new ``members_hash``, ``base_id``,
        ``added`` and ``removed`` of clusters. Those whose delta folds
        (:func:`.members.folds`) get, in place, the base of their whole
        member set (found by its hash, or written) and an empty delta.
        """
        long = [r for r in rows
                if db_members.folds(r['added'], r['removed'])]
        if not long:
            return
        texts = self._base_texts(r['base_id'] for r in long)
        full = {r['members_hash']: db_members.members_text(
            db_members.resolve(texts.get(r['base_id'], ''), r['added'],
                               r['removed'])) for r in long}
        ids = self._base_ids(full)
        new = [h for h in full if h not in ids]
        if new:
            self.session.execute(sa.insert(models.MemberBase), [
                {'members_hash': h, 'members': full[h]} for h in new])
            ids.update(self._base_ids(new))
        for r in long:
            self._orphans.add(r['base_id'])
            bid = ids[r['members_hash']]
            self._bases[bid] = full[r['members_hash']]
            r.update(base_id=bid, added='', removed='')

    def _drop_orphan_bases(self):
        """Delete the candidate bases no cluster uses any more."""
        ids = sorted(b for b in self._orphans if b is not None)
        self._orphans.clear()
        base, cluster = models.MemberBase, models.Cluster
        for i in range(0, len(ids), 500):
            self.session.execute(sa.delete(base).where(
                base.id.in_(ids[i:i + 500]),
                ~sa.exists().where(cluster.base_id == base.id)))

    def clusters_of_image(self, image, digests=None):
        """Ids of the clusters ``image`` is a member of, ascending.

        Found through the image's own keys (``digests``: its digest list,
        read if not given): every key of an image is in a cluster holding
        it, and a cluster holds only images holding all its keys.
        """
        if digests is None:
            digests = self.load_digests(image)
        _keys, clusters = self.lookup(fp_keys.image_key_set(image, digests))
        return np.unique(clusters).tolist()

    def refresh_smallest(self, cluster_ids):
        """Recompute ``min_seq`` and ``min_public_seq`` of clusters.

        After a member left them, or a member's visibility changed.
        """
        lists = self.member_lists(cluster_ids)
        public = self.public_seqs(
            {s for m in lists.values() for s in m.tolist()})
        rows = []
        for cid, m in lists.items():
            pub = [x for x in m.tolist() if x in public]
            rows.append({'id': cid, 'm': int(m.min()) if len(m) else 0,
                         'p': min(pub) if pub else None})
        if rows:
            self.session.execute(sa.text(
                'UPDATE vmar_clusters SET min_seq = :m, min_public_seq = :p '
                'WHERE id = :id'), rows)

    def _singleton_cluster(self, seq, public):
        """The cluster whose only member is image ``seq``, made if need be."""
        h = db_members.members_hash([seq])
        cid = self.session.execute(sa.select(models.Cluster.id).where(
            models.Cluster.members_hash == h)).scalar()
        if cid is not None:
            return cid
        cluster = models.Cluster(members_hash=h, n_images=1,
                                 n_fingerprints=0, min_seq=seq,
                                 min_public_seq=seq if public else None,
                                 base_id=None, added='%d' % seq, removed='')
        self.session.add(cluster)
        self.session.flush()
        return cluster.id

    def _adjust_counts(self, deltas):
        """Add ``deltas[cid]`` to each cluster's fingerprint count."""
        if deltas:
            self.session.execute(sa.text(
                'UPDATE vmar_clusters SET n_fingerprints = n_fingerprints + '
                ':d WHERE id = :cid'),
                [{'cid': int(c), 'd': int(d)} for c, d in deltas.items()])

    def _drop_clusters(self, ids, info):
        """Delete clusters ``ids`` (``info``: their rows, as read)."""
        self._orphans.update(info[c].base_id for c in ids)
        sh = models.ClusterShadow
        for i in range(0, len(ids), 500):
            part = [int(c) for c in ids[i:i + 500]]
            self.session.execute(sa.delete(models.Cluster).where(
                models.Cluster.id.in_(part)))
            self.session.execute(sa.delete(sh).where(
                sh.cluster_id.in_(part)))

    def _ids_by_hash(self, hashes):
        out = {}
        hashes = list(hashes)
        for i in range(0, len(hashes), 500):
            for cid, h in self.session.execute(
                    sa.select(models.Cluster.id, models.Cluster.members_hash)
                    .where(models.Cluster.members_hash.in_(
                        hashes[i:i + 500]))):
                out[h] = cid
        return out

    def _create_clusters(self, rows):
        """Insert cluster rows; returns members hash -> new cluster id."""
        self.session.execute(sa.insert(models.Cluster), rows)
        return self._ids_by_hash([r['members_hash'] for r in rows])

    def _cluster_info(self, ids):
        """Cluster rows by id, as :class:`ClusterRow`."""
        return {row[0]: ClusterRow._make(row) for row in
                self._sql.rows_by_id(ids, ClusterRow._fields[1:])}

    # -- adding and removing an image's keys ----------------------------------

    def add_keys(self, seq, keys, public, found=None, new=None,
                 new_filter=None, grouped=None):
        """Add image ``seq`` as a member for every key in ``keys``.

        ``keys``: the image's distinct keys, sorted.

        ``public``: whether the image is public (clusters keep their
        smallest public member). ``found``: the ``(keys, clusters)`` of
        those of ``keys`` in the table, if already known (they must be
        current); ``new``: the others, if known too (sorted), and
        ``new_filter`` their :class:`KeyFilter` for the content log;
        ``grouped``: :func:`group_by_cluster` of ``found``, if made too.
        The work per key is then done before this call.

        Returns the image's ``(keys, cluster ids)`` afterwards, unsorted, so
        that map generation need not read them back (most callers do not
        need them: no sort on the ingest path).
        """
        found_k, found_c = found or self.lookup(keys)
        if new is None or found is None:
            new = np.setdiff1d(keys, found_k, assume_unique=True)
            new_filter = None
        if grouped is None or found is None:
            grouped = group_by_cluster(found_k, found_c)
        by_cluster, span = grouped
        ids = np.array(sorted(span), dtype=np.int64)
        self._added = (new, ids, new_filter)
        out_k, out_c = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        covered = self._covered(ids, seq)
        if covered:
            # clusters with a public member before seq: it only shadows
            self._add_shadows([(c, seq) for c in covered])
            for c in covered:
                lo, hi = span[c]
                out_k.append(by_cluster[lo:hi])
                out_c.append(np.full(hi - lo, c, np.int64))
            gone = set(covered)
            span = {c: v for c, v in span.items() if c not in gone}
        if span:
            k, c = self._regroup(by_cluster, None, seq, True, public,
                                 image_keys=keys, span=span)
            out_k.append(k)
            out_c.append(c)
        if len(new):
            cid = self._singleton_cluster(seq, public)
            self._sql.add_fingerprints(new, cid)
            self._adjust_counts({cid: len(new)})
            out_k.append(new)
            out_c.append(np.full(len(new), cid, dtype=np.int64))
        return np.concatenate(out_k), np.concatenate(out_c)

    def remove_keys(self, seq, keys):
        """Remove image ``seq`` from the clusters of ``keys``.

        As a shadow holder it only leaves; as a member, the shadows its
        leaving uncovers become members (:meth:`_recover`).
        """
        found_k, found_c = self.lookup(keys)
        if len(found_k) != len(keys):
            raise exception.LibraryInconsistent(
                what='image %d has %d fingerprint keys missing from the '
                'fingerprint table' % (seq, len(keys) - len(found_k)))
        shadowed = self._drop_shadows_of(seq)
        if shadowed:
            member = ~fp_keys.isin(found_c, np.array(sorted(shadowed),
                                                     dtype=np.int64))
            found_k, found_c = found_k[member], found_c[member]
        if len(found_k):
            self._regroup(found_k, found_c, seq, False)

    def holders_of(self, image, digests=None):
        """Which of ``image``'s keys each image shadowing it holds.

        Read before a locked transaction removes ``image`` (from a
        snapshot), for its promotions (:meth:`_promotions`) to use
        (:meth:`use_holders`): those are a read of every shadow's digest
        list. Each image's answer is tagged with its digest list, and
        bits, not keys, are kept: about 12 KiB per shadow and GiB of
        ``image``'s data.
        """
        if digests is None:
            digests = self.load_digests(image)
        keys = fp_keys.image_key_set(image, digests)
        _found, clusters = self.key_clusters(keys)
        seqs = set()
        for shadow in self.shadows_of(fp_keys.unique(clusters).tolist()
                                      ).values():
            seqs.update(shadow.tolist())
        held = {}
        for seq, other in self.images_by_seq(sorted(seqs)).items():
            if other.digests_sha256 is None:
                continue        # a list of before 0023: read under the lock
            held[seq, other.digests_sha256] = np.packbits(fp_keys.isin(
                keys, fp_keys.image_key_set(other, self.load_digests(other))))
        return Holders(keys, held)

    def use_holders(self, holders):
        """Promotions of this transaction read ``holders`` where it fits."""
        self._holders = holders

    def _holds(self, image, keys):
        """Which of the sorted ``keys`` ``image`` holds, a bool array.

        From the holders read before the lock when they name ``image``'s
        digest list and cover ``keys``; else from the list.
        """
        pre = self._holders
        bits = None if pre is None else pre.held.get(
            (image.seq, image.digests_sha256))
        if bits is not None and len(pre.keys):
            idx = np.minimum(np.searchsorted(pre.keys, keys),
                             len(pre.keys) - 1)
            if (pre.keys[idx] == keys).all():
                return np.unpackbits(bits, count=len(pre.keys)).astype(
                    bool)[idx]
        return fp_keys.isin(keys, fp_keys.image_key_set(
            image, self.load_digests(image)))

    def recover_uncovered(self, image, digests=None):
        """Make members of the shadows ``image`` no longer covers.

        After ``image`` (a member of its clusters) stopped being public.
        A recovery can move keys into another cluster of the image (the
        one with the new member set): the clusters are read again before
        the next one then, and only then.
        """
        if digests is None:
            digests = self.load_digests(image)
        image_keys = fp_keys.image_key_set(image, digests)
        while True:
            keys, clusters = self.key_clusters(image_keys)
            shadows = self.shadows_of(fp_keys.unique(clusters).tolist())
            info = self._cluster_info(list(shadows))
            members = self._resolve(info.values())
            public = {cid: self._uncovered(members[cid], shadows[cid])
                      for cid in sorted(shadows)
                      if image.seq in set(members[cid].tolist())}
            todo = [cid for cid, pub in public.items() if pub is not None]
            if not todo:
                return
            for i, cid in enumerate(todo):
                moved = self._recover(cid, keys[clusters == cid],
                                      members[cid], info[cid], shadows[cid],
                                      public[cid])
                if moved & set(todo[i + 1:]):
                    break       # read again: a later one gained keys

    def _regroup(self, keys, clusters, seq, adding, public=False,
                 image_keys=None, span=None):
        """Add image ``seq`` to, or remove it from, the clusters of ``keys``.

        ``keys`` are the image's keys found in the table and ``clusters``
        their current clusters. A cluster whose keys all change keeps its
        fingerprint rows and changes its member set; these changes are
        batched, so the cost is a few statements for all such clusters. A
        cluster that splits (only part of it is in the image being added)
        gets a new cluster for the part, and only those keys move; or,
        given the image's sorted distinct ``image_keys``, the other part
        when that moves fewer (:meth:`_flips`). Returns ``(keys, cluster
        ids)`` of the kept keys after the change. ``span``: ``keys`` are
        already grouped by cluster (:func:`group_by_cluster`), and these
        are the clusters to change (``clusters`` is not read).
        """
        if span is None:
            keys, span = group_by_cluster(keys, clusters)
        info = self._cluster_info(list(span))
        whole = [c for c, (lo, hi) in span.items()
                 if hi - lo == info[c].n_fingerprints]
        split = [(c, np.arange(lo, hi)) for c, (lo, hi) in span.items()
                 if hi - lo != info[c].n_fingerprints]
        if not adding and split:
            raise exception.LibraryInconsistent(
                what='image %d holds only part of a cluster' % seq)
        shadows = {}
        if not adding:
            shadows, recovered = self._recover_leaving(keys, span, whole,
                                                       info, seq)
            whole = [c for c in whole if c not in recovered]
        flips = {}
        if split and image_keys is not None:
            flips = self._flips(split, info, image_keys)
            split = [(cid, grp) for cid, grp in split if cid not in flips]
            whole += list(flips)
        dest = self._toggle_whole(whole, keys, span, info, shadows, seq,
                                  adding, public)
        if flips:
            self._split_back(flips, info)
        if split:
            dest.update(self._split_off(split, info, keys, seq, public))
        self._drop_orphan_bases()
        out_k = [np.empty(0, np.int64)] + [keys[span[c][0]:span[c][1]]
                                           for c in dest]
        out_c = [np.empty(0, np.int64)] + [
            np.full(span[c][1] - span[c][0], d, np.int64)
            for c, d in dest.items()]
        return np.concatenate(out_k), np.concatenate(out_c)

    def _recover_leaving(self, keys, span, whole, info, seq):
        """Before ``seq`` leaves the ``whole`` clusters: their shadows.

        A cluster whose public members, once ``seq`` has left, no longer
        come before all its shadows is :meth:`_recover` ed here. Returns
        the other clusters' shadow seqs (``{cluster id: seqs}``, those with
        any), for the change that follows, and the set of those recovered.
        """
        shadows = self.shadows_of(whole)
        recovered = set()
        if not shadows:
            return shadows, recovered
        members = self._resolve(info[c] for c in shadows)
        for cid in list(shadows):
            rest = members[cid][members[cid] != seq]
            public = self._uncovered(rest, shadows[cid])
            if public is not None:
                lo, hi = span[cid]
                self._recover(cid, keys[lo:hi], rest, info[cid],
                              shadows.pop(cid), public, leaving=seq)
                recovered.add(cid)
        return shadows, recovered

    def _toggle_whole(self, whole, keys, span, info, shadows, seq, adding,
                      public):
        """Toggle ``seq`` in clusters whose keys are all the image's.

        Each cluster's new member set is its old one toggled by ``seq``: a
        cluster ``seq`` was the only member of goes with its keys; one
        whose new set has a cluster already moves its keys (and
        ``shadows``) there; the others change their member set in place
        (:meth:`_relabel`). Returns old cluster id -> cluster id after.
        """
        new_hash = {cid: db_members.toggle(info[cid].members_hash, seq)
                    for cid in whole}
        # Adding: no cluster holds seq yet (a new image, or one whose keys
        # were just removed), so no C + {seq} exists; the unique index on
        # members_hash would refuse a duplicate. Removing may meet one.
        existing = {} if adding else self._ids_by_hash(new_hash.values())
        dest, relabel, emptied = {}, [], []
        for cid in whole:
            if not adding and info[cid].n_images == 1:
                emptied.append(cid)   # the image was the only member
            elif new_hash[cid] in existing:
                dst = existing[new_hash[cid]]
                lo, hi = span[cid]
                self._sql.move(keys[lo:hi], dst)
                self._adjust_counts({dst: hi - lo})
                if cid in shadows:
                    self._add_shadows([(dst, x) for x in
                                       shadows[cid].tolist()])
                self._drop_clusters([cid], info)
                dest[cid] = dst
            else:
                relabel.append(cid)
                dest[cid] = cid
        if emptied:
            self._sql.delete(np.concatenate(
                [keys[span[c][0]:span[c][1]] for c in emptied]))
            self._drop_clusters(emptied, info)
        if relabel:
            self._relabel(relabel, info, new_hash, seq, adding, public)
        return dest

    # -- shadow holders ------------------------------------------------------

    def _covered(self, ids, seq):
        """Those of the clusters ``ids`` image ``seq`` only shadows, sorted.

        Those with a public member before ``seq``.
        """
        if not len(ids):
            return []
        cl, _low, low_pub = self.cluster_minima(ids)
        return sorted(cl[(low_pub >= 0) & (low_pub < seq)].tolist())

    def _add_shadows(self, pairs):
        """Record ``(cluster id, seq)`` shadow holders, those not yet."""
        sh = models.ClusterShadow
        pairs = sorted({(int(c), int(q)) for c, q in pairs})
        have = set()
        for i in range(0, len(pairs), 500):
            have.update(tuple(r) for r in self.session.execute(
                sa.select(sh.cluster_id, sh.seq).where(
                    sa.tuple_(sh.cluster_id, sh.seq).in_(pairs[i:i + 500]))))
        rows = [{'cluster_id': c, 'seq': q} for c, q in pairs
                if (c, q) not in have]
        if rows:
            self.session.execute(sa.insert(sh), rows)

    def shadows_of(self, cluster_ids):
        """``{cluster id: shadow seqs, ascending int64}``, those with any."""
        sh = models.ClusterShadow
        ids = sorted({int(c) for c in cluster_ids})
        out = {}
        for i in range(0, len(ids), 500):
            for cid, seq in self.session.execute(
                    sa.select(sh.cluster_id, sh.seq).where(
                        sh.cluster_id.in_(ids[i:i + 500]))):
                out.setdefault(cid, []).append(seq)
        return {c: np.array(sorted(v), dtype=np.int64)
                for c, v in out.items()}

    def shadow_rows(self):
        """Every ``(cluster id, seq)`` shadow holder."""
        sh = models.ClusterShadow
        return [tuple(r) for r in self.session.execute(
            sa.select(sh.cluster_id, sh.seq))]

    def _copy_shadows(self, pairs):
        """Give each ``{old: new}`` cluster the old one's shadow holders.

        After a split: the new cluster holds some keys of the old, and
        all the public members before them.
        """
        got = self.shadows_of(pairs)
        self._add_shadows([(pairs[c], q) for c, sh in got.items()
                           for q in sh.tolist()])

    def _drop_shadows_of(self, seq):
        """Forget image ``seq`` as a shadow holder; its clusters, a set."""
        sh = models.ClusterShadow
        cids = set(self.session.execute(sa.select(sh.cluster_id).where(
            sh.seq == seq)).scalars())
        if cids:
            self.session.execute(sa.delete(sh).where(sh.seq == seq))
        return cids

    def _uncovered(self, members, shadows):
        """The public seqs of ``members`` if a shadow comes before them.

        (Then the cluster must be :meth:`_recover` ed with them.) None
        when a public member comes before every shadow, or there is no
        shadow.
        """
        if not len(shadows):
            return None
        public = self.public_seqs(members.tolist())
        return public if not public or min(public) > int(shadows[0]) \
            else None

    def _recover(self, cid, keys, members, row, shadows, public,
                 leaving=None):
        """Make members of the shadows of cluster ``cid`` left uncovered.

        ``keys``: the cluster's keys; ``members``: its members once
        ``leaving`` (a member, or None) has left; ``row``: its row as
        read; ``shadows``: its shadow seqs, ascending; ``public``: the
        public seqs among ``members`` (:meth:`_uncovered`). The shadows before
        the first public member are read in order: each becomes a member
        for the keys no public image before it holds, and stays a shadow
        for the others. The keys are then grouped by their new member
        sets, each group into the cluster of that set (found or made);
        keys no image holds any more are deleted. The shadows not read
        (all keys were covered before them) stay shadows of every group
        (:meth:`_promotions` reads them). Returns the other clusters keys
        moved into.
        """
        images, held, promoted, joins = self._promotions(keys, shadows,
                                                         public)
        unread = [q for q in shadows.tolist() if q not in held]
        groups, inverse = np.unique(joins, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        base = members.tolist()
        deltas, gone, moves, sets = {}, [], [], []
        for g, pattern in enumerate(groups.tolist()):
            sel = np.flatnonzero(inverse == g)
            joined = [q for q, on in zip(promoted, pattern) if on]
            new = sorted(set(base) | set(joined))
            if not new:
                gone.append(keys[sel])
                continue
            stay = [q for q in unread] + [
                q for q in held if q not in joined and held[q][sel].any()]
            sets.append((new, joined, sel, stay))
        found = self._ids_by_hash(db_members.members_hash(m)
                                  for m, _j, _s, _t in sets)
        create = []
        for new, joined, _sel, _stay in sets:
            h = db_members.members_hash(new)
            if h in found or h in {r['members_hash'] for r in create}:
                continue
            added, removed = row.added, row.removed
            if leaving is not None:
                added, removed = db_members.delta_remove(added, removed,
                                                         leaving)
            for q in joined:
                added, removed = db_members.delta_add(added, removed, q)
            pub = [q for q in new if q in public
                   or (q in images and images[q].visibility == 'public')]
            create.append({
                'members_hash': h, 'n_images': len(new),
                'n_fingerprints': 0, 'min_seq': new[0],
                'min_public_seq': min(pub) if pub else None,
                'base_id': row.base_id, 'added': added,
                'removed': removed})
        if create:
            self._fold(create)
            found.update(self._create_clusters(create))
        pairs, dests = [], set()
        for new, _joined, sel, stay in sets:
            dst = found[db_members.members_hash(new)]
            dests.add(dst)
            if dst != cid:
                moves.append((keys[sel], dst))
                deltas[dst] = deltas.get(dst, 0) + len(sel)
                deltas[cid] = deltas.get(cid, 0) - len(sel)
            pairs += [(dst, q) for q in stay]
        for k, dst in moves:
            self._sql.move(k, dst)
        if gone:
            dead = np.concatenate(gone)
            self._sql.delete(dead)
            deltas[cid] = deltas.get(cid, 0) - len(dead)
        sh = models.ClusterShadow
        self.session.execute(sa.delete(sh).where(sh.cluster_id == cid))
        if -deltas.get(cid, 0) == row.n_fingerprints:
            self._drop_clusters([cid], {cid: row})
            deltas.pop(cid)
        self._adjust_counts(deltas)
        self._add_shadows(pairs)
        self._drop_orphan_bases()
        return dests - {cid}

    def _promotions(self, keys, shadows, public):
        """Which shadows of a cluster become members, for which keys.

        ``keys``: the cluster's; ``shadows``: its shadow seqs, ascending;
        ``public``: the public seqs among its members. The shadows before
        the first public member are read in order until public images
        cover every key; a shadow is promoted if it holds a key no public
        image before it holds. Returns ``(images, held, promoted,
        joins)``: the images read by seq, the keys each holds (bool
        arrays), the promoted seqs in order, and a (keys x promoted) bool
        array of the keys each promoted shadow becomes a member for.
        """
        first_public = min(public) if public else None
        need = [q for q in shadows.tolist()
                if first_public is None or q < first_public]
        images = self.images_by_seq(need)
        covered = np.zeros(len(keys), dtype=bool)
        held, promoted = {}, []
        for q in need:
            if covered.all():
                break
            img = images[q]
            held[q] = self._holds(img, keys)
            if (held[q] & ~covered).any():
                promoted.append(q)
            if img.visibility == 'public':
                covered |= held[q]
        # each key's new members: those promoted where it was uncovered
        covered[:] = False
        joins = np.zeros((len(keys), len(promoted)), dtype=bool)
        for j, q in enumerate(promoted):
            joins[:, j] = held[q] & ~covered
            if images[q].visibility == 'public':
                covered |= held[q]
        return images, held, promoted, joins

    def _split_off(self, splits, info, keys, seq, public):
        """Move each split cluster's keys in the image to old members + seq.

        ``splits`` is a list of (cluster id, key index array). The clusters
        for the new member sets are found or created together, a few
        statements for all of them. Returns old cluster id -> new cluster
        id.
        """
        want = {cid: db_members.toggle(info[cid].members_hash, seq)
                for cid, _grp in splits}
        found = self._ids_by_hash(want.values())
        create = [cid for cid, _grp in splits if want[cid] not in found]
        if create:
            rows = []
            for c in create:
                added, removed = db_members.delta_add(
                    info[c].added, info[c].removed, seq)
                rows.append({
                    'members_hash': want[c], 'n_images': info[c].n_images + 1,
                    'n_fingerprints': 0, 'min_seq': min(info[c].min_seq, seq),
                    'min_public_seq': _smaller(info[c].min_public_seq,
                                               seq if public else None),
                    'base_id': info[c].base_id, 'added': added,
                    'removed': removed})
            self._fold(rows)
            found.update(self._create_clusters(rows))
        dest, deltas = {}, {}
        for cid, grp in splits:
            new = found[want[cid]]
            self._sql.move(keys[grp], new)
            deltas[new] = deltas.get(new, 0) + len(grp)
            deltas[cid] = deltas.get(cid, 0) - len(grp)
            dest[cid] = new
        self._adjust_counts(deltas)
        self._copy_shadows(dest)
        return dest

    def _flips(self, split, info, image_keys):
        """Split clusters cheaper to split the other way round.

        A split cluster moves the keys on the image's side to a new
        cluster. When most of the cluster is in the image (typically the
        base system that nearly every image holds, minus the few files this
        one changed), it is cheaper for the cluster to take the image as a
        member and to move its keys outside the image to a new cluster with
        the old member set. Those keys are found without an index on
        cluster ids: every member of a cluster holds all its keys, so they
        are among the keys that a few members hold and the image does not;
        those candidates are looked up.

        ``split``: (cluster id, key index array) pairs; ``image_keys``: the
        image's sorted distinct keys. Returns cluster id -> its keys
        outside the image, for the clusters worth flipping.
        """
        wanted = []
        for cid, grp in split:
            outside = info[cid].n_fingerprints - len(grp)
            if len(grp) - outside >= FLIP_MIN_SAVING:
                wanted.append((cid, outside, len(grp) - outside))
        if not wanted:
            return {}
        # the smallest members: lists are ascending
        bases = self._base_texts(info[cid].base_id for cid, _o, _s in wanted)
        members = {cid: db_members.smallest(
            bases.get(info[cid].base_id, ''), info[cid].added,
            info[cid].removed, FLIP_MEMBERS).tolist()
            for cid, _o, _s in wanted}
        images = self.images_by_seq({m for ms in members.values()
                                     for m in ms})
        keysets = {}

        def keyset(seq):
            if seq not in keysets:
                img = images[seq]
                keysets[seq] = fp_keys.image_key_set(
                    img, self.load_digests(img))
            return keysets[seq]

        chosen, parts = [], []
        for cid, outside, saving in wanted:
            candidates = None
            for m in members[cid]:
                if images[m].n_blocks > FLIP_BLOCKS_PER_MOVE * saving:
                    continue   # reading its digests costs more than it saves
                if candidates is None:
                    candidates = keyset(m)
                    candidates = candidates[~fp_keys.isin(candidates,
                                                          image_keys)]
                elif len(candidates) > saving:
                    candidates = candidates[fp_keys.isin(candidates,
                                                         keyset(m))]
            if candidates is None or (
                    len(candidates) > FLIP_LOOKUPS_PER_MOVE * saving):
                continue   # more lookups than the moves they would save
            chosen.append((cid, outside))
            parts.append(candidates)
        if not chosen:
            return {}
        k, c = self.lookup(fp_keys.unique(np.concatenate(parts)))
        flips = {}
        for cid, outside in chosen:
            rest = k[c == cid]
            if len(rest) != outside:
                raise exception.LibraryInconsistent(
                    what='cluster %d has %d keys outside the image being '
                    'added, but its members hold %d keys of it outside the '
                    'image' % (cid, outside, len(rest)))
            flips[cid] = rest
        return flips

    def _split_back(self, flips, info):
        """Give each flipped cluster's keys outside the image a new cluster.

        Runs after the relabel that made the image a member of the flipped
        clusters (and freed their old member-set hashes): the new clusters
        take the old member sets, hashes and smallest members (``info``,
        read before the relabel).
        """
        ids = self._create_clusters([
            {'members_hash': info[c].members_hash,
             'n_images': info[c].n_images, 'n_fingerprints': len(rest),
             'min_seq': info[c].min_seq,
             'min_public_seq': info[c].min_public_seq,
             'base_id': info[c].base_id, 'added': info[c].added,
             'removed': info[c].removed}
            for c, rest in flips.items()])
        for c, rest in flips.items():
            self._sql.move(rest, ids[info[c].members_hash])
        self._copy_shadows({c: ids[info[c].members_hash] for c in flips})
        self._adjust_counts({c: -len(rest) for c, rest in flips.items()})

    def _relabel(self, cids, info, new_hash, seq, adding, public):
        """Add ``seq`` to, or remove it from, whole clusters: no key moves."""
        change = db_members.delta_add if adding else db_members.delta_remove
        rows = []
        for c in cids:
            added, removed = change(info[c].added, info[c].removed, seq)
            rows.append({'id': c, 'members_hash': new_hash[c],
                         'base_id': info[c].base_id, 'added': added,
                         'removed': removed})
        self._fold(rows)
        # seq is an int: inlined
        also = 'n_images = n_images + %d' % (1 if adding else -1)
        if adding:
            also += (', min_seq = CASE WHEN %d < min_seq THEN %d '
                     'ELSE min_seq END' % (seq, seq))
            if public:
                also += (', min_public_seq = CASE WHEN min_public_seq IS '
                         'NULL OR %d < min_public_seq THEN %d '
                         'ELSE min_public_seq END' % (seq, seq))
        for i in range(0, len(rows), 10000):
            self._sql.set_members(rows[i:i + 10000], also)
        if not adding:
            self.refresh_smallest(cids)
