"""Cluster operations of the VMAR paper (Fig. 4-7) on the SQL tables.

A *fingerprint key* is the first 8 bytes of a block digest as a signed
64-bit integer, XORed with the image's *space key* (a constant per hash
algorithm and block size, 0 for SHA-256 over 4 KiB). The fingerprint table
is keyed by it. Full digests live in each image's digest list and are
compared whenever a map is built, so two digests that share a key (by
accident or by a crafted collision) never redirect a read to different
content: they only share a cluster row.

All functions here expect to run inside :func:`session.locked_writer` when
they mutate.
"""

import hashlib

import numpy as np
import sqlalchemy as sa

from vmar_openstack.db import bulk
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys

DIGEST_CHUNK_BYTES = 4 << 20
# A split is flipped (see _flips) when it saves this many key moves, and
# only if it costs at most this many lookups, and reads the digests of
# members of at most this many blocks, per move saved. The keys outside
# the image are sought among those of up to FLIP_MEMBERS members.
FLIP_MIN_SAVING = 256
FLIP_LOOKUPS_PER_MOVE = 2
FLIP_BLOCKS_PER_MOVE = 64
FLIP_MEMBERS = 3
VISIBILITIES = ('public', 'private', 'shared', 'community')


# -- digest lists ----------------------------------------------------------

def store_digests(session, seq, digests):
    raw = np.ascontiguousarray(digests).tobytes()
    session.execute(sa.delete(models.ImageDigests).where(
        models.ImageDigests.seq == seq))
    rows = [{'seq': seq, 'chunk': i // DIGEST_CHUNK_BYTES,
             'data': raw[i:i + DIGEST_CHUNK_BYTES]}
            for i in range(0, len(raw), DIGEST_CHUNK_BYTES)]
    if rows:
        session.execute(sa.insert(models.ImageDigests), rows)


def load_digests(session, image, dsize):
    chunks = session.execute(
        sa.select(models.ImageDigests.data)
        .where(models.ImageDigests.seq == image.seq)
        .order_by(models.ImageDigests.chunk)).scalars().all()
    raw = b''.join(chunks)
    if len(raw) != image.n_blocks * dsize:
        raise exception.LibraryInconsistent(
            what='digest list of image %s has %d bytes, expected %d'
            % (image.image_id, len(raw), image.n_blocks * dsize))
    return np.frombuffer(raw, dtype=np.uint8).reshape(image.n_blocks, dsize)


# -- clusters ---------------------------------------------------------------

def _member_hash(seq):
    return int.from_bytes(hashlib.sha256(b'vmar-member-%d' % seq).digest()[
        :16], 'little')


def members_hash(members):
    """Identity of a member set: XOR of 128-bit hashes of its members.

    XOR makes adding or removing one member O(1), without reading the
    others: ``hash(M | {x}) == hash(M) ^ hash({x})``.
    """
    h = 0
    for m in members:
        h ^= _member_hash(m)
    return '%032x' % h


def _toggle(hash_hex, seq):
    return '%032x' % (int(hash_hex, 16) ^ _member_hash(seq))


def parse_members(text):
    """The member seqs of a cluster row's ``members`` text, as int64.

    The text lists ascending runs of seqs, comma-separated: ``a`` or
    ``a-b`` (``a`` to ``b``). Seqs grow with every add, so a cluster that
    nearly every image holds lists a few runs, however many members it
    has, and adding the newest image extends its last run.
    """
    out = [np.empty(0, np.int64)]
    for part in text.split(',') if text else ():
        lo, _sep, hi = part.partition('-')
        out.append(np.arange(int(lo), int(hi or lo) + 1, dtype=np.int64))
    return np.concatenate(out)


def members_text(seqs):
    """The ``members`` text of the seqs (distinct)."""
    m = np.unique(np.asarray(seqs, dtype=np.int64))
    if not len(m):
        return ''
    brk = np.flatnonzero(np.diff(m) != 1)
    starts = np.concatenate([[0], brk + 1]).tolist()
    ends = np.append(brk, len(m) - 1).tolist()
    ml = m.tolist()
    return ','.join('%d' % ml[a] if a == b else '%d-%d' % (ml[a], ml[b])
                    for a, b in zip(starts, ends))


def add_member(text, seq):
    """``text`` with ``seq`` added; cheap when ``seq`` is the largest."""
    if text:
        head, _sep, last = text.rpartition(',')
        lo, _sep, hi = last.partition('-')
        end = int(hi or lo)
        if seq == end + 1:
            return '%s%s%s-%d' % (head, ',' if head else '', lo, seq)
        if seq > end:
            return '%s,%d' % (text, seq)
    return members_text(np.append(parse_members(text), seq))


def remove_member(text, seq):
    """``text`` without ``seq``."""
    m = parse_members(text)
    return members_text(m[m != seq])


def member_texts(session, cluster_ids):
    """Map cluster id -> its ``members`` text."""
    src, col = bulk.source(db_session.dialect(session))
    sql = ('SELECT c.id, c.members FROM %s JOIN vmar_clusters c ON c.id = %s'
           % (src.replace(':keys', '?'), col))
    ids = np.asarray([int(c) for c in cluster_ids], dtype=np.int64)
    out = {}
    for i in range(0, len(ids), bulk.BATCH):
        out.update(bulk.fetch_rows(session, sql,
                                   (bulk.encode(ids[i:i + bulk.BATCH]),)))
    return out


def cluster_members(session, cluster_ids):
    """Map cluster id -> frozenset of member image seqs."""
    return {cid: frozenset(parse_members(text).tolist())
            for cid, text in member_texts(session, cluster_ids).items()}


def clusters_of_image(session, seq):
    """Ids of the clusters image ``seq`` is a member of.

    Reads every cluster row: for deletes and metadata changes, not for
    adds.
    """
    return [cid for cid, text in session.execute(sa.select(
            models.Cluster.id, models.Cluster.members))
            if seq in parse_members(text)]


def _singleton_cluster(session, seq, public):
    """The cluster whose only member is image ``seq``, created if need be."""
    h = members_hash([seq])
    cid = session.execute(sa.select(models.Cluster.id).where(
        models.Cluster.members_hash == h)).scalar()
    if cid is not None:
        return cid
    cluster = models.Cluster(members_hash=h, n_images=1, n_fingerprints=0,
                             min_seq=seq,
                             min_public_seq=seq if public else None,
                             members=members_text([seq]))
    session.add(cluster)
    session.flush()
    return cluster.id


def refresh_smallest(session, cluster_ids):
    """Recompute ``min_seq`` and ``min_public_seq`` of clusters.

    After a member left them, or a member's visibility changed.
    """
    public = {row.seq for row in image_rows(session)
              if row.visibility == 'public'}
    rows = []
    for cid, text in member_texts(session, cluster_ids).items():
        m = parse_members(text)
        pub = [x for x in m.tolist() if x in public]
        rows.append({'id': cid, 'm': int(m.min()) if len(m) else 0,
                     'p': min(pub) if pub else None})
    if rows:
        session.execute(sa.text(
            'UPDATE vmar_clusters SET min_seq = :m, min_public_seq = :p '
            'WHERE id = :id'), rows)


def _adjust_counts(session, deltas):
    """Add ``deltas[cid]`` to each cluster's fingerprint count."""
    if deltas:
        session.execute(sa.text(
            'UPDATE vmar_clusters SET n_fingerprints = n_fingerprints + :d '
            'WHERE id = :cid'),
            [{'cid': int(c), 'd': int(d)} for c, d in deltas.items()])


def _drop_clusters(session, ids):
    for i in range(0, len(ids), 500):
        part = [int(c) for c in ids[i:i + 500]]
        session.execute(sa.delete(models.Cluster).where(
            models.Cluster.id.in_(part)))


def _ids_by_hash(session, hashes):
    out = {}
    hashes = list(hashes)
    for i in range(0, len(hashes), 500):
        for cid, h in session.execute(
                sa.select(models.Cluster.id, models.Cluster.members_hash)
                .where(models.Cluster.members_hash.in_(hashes[i:i + 500]))):
            out[h] = cid
    return out


def _create_clusters(session, rows):
    """Insert cluster rows; returns members hash -> new cluster id."""
    session.execute(sa.insert(models.Cluster), rows)
    return _ids_by_hash(session, [r['members_hash'] for r in rows])


def _cluster_info(session, ids):
    """Cluster rows by id, as tuples of the columns after the id."""
    src, col = bulk.source(db_session.dialect(session))
    sql = ('SELECT c.id, c.members_hash, c.n_images, c.n_fingerprints, '
           'c.min_seq, c.min_public_seq, c.members FROM %s JOIN '
           'vmar_clusters c ON c.id = %s' % (src.replace(':keys', '?'), col))
    info = {}
    for i in range(0, len(ids), bulk.BATCH):
        for row in bulk.fetch_rows(session, sql,
                                   (bulk.encode(ids[i:i + bulk.BATCH]),)):
            info[row[0]] = tuple(row[1:])
    return info


def _smaller(a, b):
    """min() where None means "none"."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def _split_off(session, dialect, splits, info, keys, seq, public):
    """Move each split cluster's keys in the image to old members + seq.

    ``splits`` is a list of (cluster id, key index array). The clusters
    for the new member sets are found or created together, a few
    statements for all of them. Returns old cluster id -> new cluster id.
    """
    want = {cid: _toggle(info[cid][0], seq) for cid, _grp in splits}
    found = _ids_by_hash(session, want.values())
    create = [cid for cid, _grp in splits if want[cid] not in found]
    if create:
        found.update(_create_clusters(session, [
            {'members_hash': want[c], 'n_images': info[c][1] + 1,
             'n_fingerprints': 0, 'min_seq': min(info[c][3], seq),
             'min_public_seq': _smaller(info[c][4], seq if public else None),
             'members': add_member(info[c][5], seq)}
            for c in create]))
    dest, deltas = {}, {}
    for cid, grp in splits:
        new = found[want[cid]]
        bulk.move(session, dialect, keys[grp], new)
        deltas[new] = deltas.get(new, 0) + len(grp)
        deltas[cid] = deltas.get(cid, 0) - len(grp)
        dest[cid] = new
    _adjust_counts(session, deltas)
    return dest


def _flips(session, dialect, split, info, image_keys):
    """Split clusters cheaper to split the other way round.

    A split cluster moves the keys on the image's side to a new cluster.
    When most of the cluster is in the image (typically the base system
    that nearly every image holds, minus the few files this one changed),
    it is cheaper for the cluster to take the image as a member and to
    move its keys outside the image to a new cluster with the old member
    set. Those keys are found without an index on cluster ids: every
    member of a cluster holds all its keys, so they are among the keys
    that a few members hold and the image does not; those candidates are
    looked up.

    ``split``: (cluster id, key index array) pairs; ``image_keys``: the
    image's sorted distinct keys. Returns cluster id -> its keys outside
    the image, for the clusters worth flipping.
    """
    wanted = []
    for cid, grp in split:
        outside = info[cid][2] - len(grp)
        if len(grp) - outside >= FLIP_MIN_SAVING:
            wanted.append((cid, outside, len(grp) - outside))
    if not wanted:
        return {}
    # the smallest members: lists are ascending
    members = {cid: parse_members(info[cid][5])[:FLIP_MEMBERS].tolist()
               for cid, _o, _s in wanted}
    images = images_by_seq(session, {m for ms in members.values()
                                     for m in ms})
    keysets = {}

    def keyset(seq):
        if seq not in keysets:
            img = images[seq]
            keysets[seq] = fp_keys.image_key_set(img, load_digests(
                session, img, fingerprint.DIGEST_SIZES[img.algorithm]))
        return keysets[seq]

    chosen, parts = [], []
    for cid, outside, saving in wanted:
        candidates = None
        for m in members[cid]:
            if images[m].n_blocks > FLIP_BLOCKS_PER_MOVE * saving:
                continue   # reading its digests costs more than it saves
            if candidates is None:
                candidates = keyset(m)
                candidates = candidates[~fp_keys.isin(candidates, image_keys)]
            elif len(candidates) > saving:
                candidates = candidates[fp_keys.isin(candidates, keyset(m))]
        if candidates is None or (
                len(candidates) > FLIP_LOOKUPS_PER_MOVE * saving):
            continue   # more lookups than the moves they would save
        chosen.append((cid, outside))
        parts.append(candidates)
    if not chosen:
        return {}
    k, c = bulk.lookup(session, dialect, fp_keys.unique(np.concatenate(parts)))
    flips = {}
    for cid, outside in chosen:
        rest = k[c == cid]
        if len(rest) != outside:
            raise exception.LibraryInconsistent(
                what='cluster %d has %d keys outside the image being added, '
                'but its members hold %d keys of it outside the image'
                % (cid, outside, len(rest)))
        flips[cid] = rest
    return flips


def _split_back(session, dialect, flips, info):
    """Give each flipped cluster's keys outside the image a new cluster.

    Runs after the relabel that made the image a member of the flipped
    clusters (and freed their old member-set hashes): the new clusters
    take the old member sets, hashes and smallest members (``info``, read
    before the relabel).
    """
    ids = _create_clusters(session, [
        {'members_hash': info[c][0], 'n_images': info[c][1],
         'n_fingerprints': len(rest), 'min_seq': info[c][3],
         'min_public_seq': info[c][4], 'members': info[c][5]}
        for c, rest in flips.items()])
    for c, rest in flips.items():
        bulk.move(session, dialect, rest, ids[info[c][0]])
    _adjust_counts(session, {c: -len(rest) for c, rest in flips.items()})


def _relabel(session, cids, info, new_hash, seq, adding, public):
    """Add ``seq`` to, or remove it from, whole clusters: no key moves."""
    dialect = db_session.dialect(session)
    change = add_member if adding else remove_member
    members = {c: change(info[c][5], seq) for c in cids}
    # seq is an int: inlined
    also = 'n_images = n_images + %d' % (1 if adding else -1)
    if adding:
        also += (', min_seq = CASE WHEN %d < min_seq THEN %d '
                 'ELSE min_seq END' % (seq, seq))
        if public:
            also += (', min_public_seq = CASE WHEN min_public_seq IS NULL '
                     'OR %d < min_public_seq THEN %d '
                     'ELSE min_public_seq END' % (seq, seq))
    for i in range(0, len(cids), 10000):
        part = cids[i:i + 10000]
        bulk.set_hashes(session, dialect, part, [new_hash[c] for c in part],
                        [members[c] for c in part], also)
    if not adding:
        refresh_smallest(session, cids)


def _regroup(session, dialect, keys, clusters, seq, adding, public=False,
             image_keys=None):
    """Add image ``seq`` to, or remove it from, the clusters of ``keys``.

    ``keys`` are the image's keys found in the table and ``clusters`` their
    current clusters. A cluster whose keys all change keeps its fingerprint
    rows and changes its member set; these changes are batched, so the cost
    is a few statements for all such clusters. A cluster that splits (only
    part of it is in the image being added) gets a new cluster for the part,
    and only those keys move; or, given the image's sorted distinct
    ``image_keys``, the other part when that moves fewer (:func:`_flips`).
    Returns ``(keys, cluster ids)`` of the kept keys after the change.
    """
    order = fp_keys.stable_order(clusters)
    keys, clusters = keys[order], clusters[order]
    starts = np.flatnonzero(np.diff(clusters)) + 1
    starts = np.concatenate([np.zeros(min(1, len(keys)), np.int64), starts])
    ends = np.append(starts[1:], len(keys))
    ids = clusters[starts].tolist()
    info = _cluster_info(session, ids)
    counts = (ends - starts).tolist()
    whole, split = [], []
    for cid, start, count in zip(ids, starts.tolist(), counts):
        if count == info[cid][2]:
            whole.append(cid)
        else:
            split.append((cid, np.arange(start, start + count)))
    if not adding and split:
        raise exception.LibraryInconsistent(
            what='image %d holds only part of a cluster' % seq)
    flips = {}
    if split and image_keys is not None:
        flips = _flips(session, dialect, split, info, image_keys)
        split = [(cid, grp) for cid, grp in split if cid not in flips]
        whole += list(flips)
    span = dict(zip(ids, zip(starts.tolist(), ends.tolist())))
    dest = {}
    # whole clusters: new member set = old toggled by seq
    new_hash = {cid: _toggle(info[cid][0], seq) for cid in whole}
    # Adding: no cluster holds seq yet (a new image, or one whose keys
    # were just removed), so no C + {seq} exists; the unique index on
    # members_hash would refuse a duplicate. Removing may meet one.
    existing = {} if adding else _ids_by_hash(session, new_hash.values())
    relabel, emptied = [], []
    for cid in whole:
        if not adding and info[cid][1] == 1:
            emptied.append(cid)   # the image was the cluster's only member
        elif new_hash[cid] in existing:
            # the new member set has a cluster already: move the keys there
            dst = existing[new_hash[cid]]
            lo, hi = span[cid]
            bulk.move(session, dialect, keys[lo:hi], dst)
            _adjust_counts(session, {dst: hi - lo})
            _drop_clusters(session, [cid])
            dest[cid] = dst
        else:
            relabel.append(cid)
            dest[cid] = cid
    if emptied:
        bulk.delete(session, dialect, np.concatenate(
            [keys[span[c][0]:span[c][1]] for c in emptied]))
        _drop_clusters(session, emptied)
    if relabel:
        _relabel(session, relabel, info, new_hash, seq, adding, public)
    if flips:
        _split_back(session, dialect, flips, info)
    if split:
        dest.update(_split_off(session, dialect, split, info, keys, seq,
                               public))
    out_k = [np.empty(0, np.int64)] + [keys[span[c][0]:span[c][1]]
                                       for c in dest]
    out_c = [np.empty(0, np.int64)] + [
        np.full(span[c][1] - span[c][0], d, np.int64)
        for c, d in dest.items()]
    return np.concatenate(out_k), np.concatenate(out_c)


def add_keys(session, seq, keys, public, found=None):
    """Add image ``seq`` as a member for every key in ``keys``.

    ``keys``: the image's distinct keys, sorted.

    ``public``: whether the image is public (clusters keep their smallest
    public member). ``found``: the ``(keys, clusters)`` of those of
    ``keys`` in the table, if already known (they must be current).

    Returns the image's ``(keys, cluster ids)`` afterwards, unsorted, so
    that map generation need not read them back (most callers do not need
    them: no sort on the ingest path).
    """
    dialect = db_session.dialect(session)
    found_k, found_c = found or bulk.lookup(session, dialect, keys)
    out_k, out_c = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    if len(found_k):
        k, c = _regroup(session, dialect, found_k, found_c, seq, True,
                        public, image_keys=keys)
        out_k.append(k)
        out_c.append(c)
    new = np.setdiff1d(keys, found_k, assume_unique=True)
    if len(new):
        cid = _singleton_cluster(session, seq, public)
        bulk.add_fingerprints(session, dialect, new, cid)
        _adjust_counts(session, {cid: len(new)})
        out_k.append(new)
        out_c.append(np.full(len(new), cid, dtype=np.int64))
    return np.concatenate(out_k), np.concatenate(out_c)


def remove_keys(session, seq, keys):
    """Remove image ``seq`` from the clusters of ``keys``."""
    dialect = db_session.dialect(session)
    found_k, found_c = bulk.lookup(session, dialect, keys)
    if len(found_k) != len(keys):
        raise exception.LibraryInconsistent(
            what='image %d has %d fingerprint keys missing from the '
            'fingerprint table' % (seq, len(keys) - len(found_k)))
    _regroup(session, dialect, found_k, found_c, seq, False)


def key_clusters(session, keys):
    """(keys, cluster ids) of the given distinct keys, sorted by key.

    Goes through the fingerprint table's primary key: the table has no
    index on ``cluster_id``, whose upkeep doubled the cost of every
    insert and move (see doc/source/design.rst).
    """
    found_k, found_c = bulk.lookup(session, db_session.dialect(session),
                                   keys)
    order = np.argsort(found_k)
    return found_k[order], found_c[order]


# -- images -----------------------------------------------------------------

def get_image(session, image_id, for_update=False):
    stmt = sa.select(models.Image).where(models.Image.image_id == image_id)
    return session.execute(stmt).scalar_one_or_none()


def images_by_seq(session, seqs):
    seqs = [int(s) for s in seqs]
    out = {}
    for i in range(0, len(seqs), 500):
        for img in session.execute(sa.select(models.Image).where(
                models.Image.seq.in_(seqs[i:i + 500]))).scalars():
            out[img.seq] = img
    return out


def image_rows(session):
    """Every image as a read-only row (attributes as on the model)."""
    return session.execute(sa.select(*models.Image.__table__.c)).all()


def list_images(session):
    return session.execute(sa.select(models.Image).order_by(
        models.Image.seq)).scalars().all()
