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

DIGEST_CHUNK_BYTES = 4 << 20
VISIBILITIES = ('public', 'private', 'shared', 'community')


def space_key(algorithm, block_size):
    """The XOR constant that separates fingerprint spaces."""
    if (algorithm, block_size) == ('sha256', 4096):
        return 0
    tag = ('%s/%d' % (algorithm, block_size)).encode()
    return int.from_bytes(hashlib.sha256(tag).digest()[:8], 'little',
                          signed=True)


def block_keys(digests, skey):
    """Per-block int64 keys of a ``(n, digest_size)`` uint8 digest array."""
    prefix = np.ascontiguousarray(digests[:, :8]).view('<i8').reshape(-1)
    return prefix ^ np.int64(skey)


def shareable_mask(digests, virtual_size, block_size):
    """Blocks that can be shared: non-zero, and not a partial last block."""
    mask = digests.any(axis=1)
    if virtual_size % block_size and len(mask):
        mask[-1] = False
    return mask


def image_key_set(image, digests):
    """Sorted distinct fingerprint keys of an image's shareable blocks."""
    mask = shareable_mask(digests, image.virtual_size, image.block_size)
    return np.unique(block_keys(digests[mask], image.space_key))


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
        raise RuntimeError('digest list of image %s has %d bytes, expected %d'
                           % (image.image_id, len(raw),
                              image.n_blocks * dsize))
    return np.frombuffer(raw, dtype=np.uint8).reshape(image.n_blocks, dsize)


# -- clusters ---------------------------------------------------------------

def members_hash(members):
    return hashlib.sha256(
        ','.join(str(m) for m in sorted(members)).encode()).hexdigest()


def cluster_members(session, cluster_ids):
    """Map cluster id -> frozenset of member image seqs."""
    out = {}
    ids = [int(c) for c in cluster_ids]
    for i in range(0, len(ids), 500):
        rows = session.execute(
            sa.select(models.ClusterMember.cluster_id,
                      models.ClusterMember.seq)
            .where(models.ClusterMember.cluster_id.in_(ids[i:i + 500])))
        for cid, seq in rows:
            out.setdefault(cid, set()).add(seq)
    return {k: frozenset(v) for k, v in out.items()}


def clusters_of_image(session, seq):
    return session.execute(
        sa.select(models.ClusterMember.cluster_id)
        .where(models.ClusterMember.seq == seq)).scalars().all()


def _get_or_create_cluster(session, members):
    h = members_hash(members)
    cid = session.execute(sa.select(models.Cluster.id).where(
        models.Cluster.members_hash == h)).scalar()
    if cid is not None:
        return cid
    cluster = models.Cluster(members_hash=h, n_images=len(members),
                             n_fingerprints=0)
    session.add(cluster)
    session.flush()
    session.execute(sa.insert(models.ClusterMember), [
        {'cluster_id': cluster.id, 'seq': m} for m in sorted(members)])
    return cluster.id


def _adjust_count(session, cid, delta):
    session.execute(sa.update(models.Cluster)
                    .where(models.Cluster.id == cid)
                    .values(n_fingerprints=models.Cluster.n_fingerprints
                            + int(delta)))


def _drop_if_empty(session, cid):
    n = session.execute(sa.select(models.Cluster.n_fingerprints).where(
        models.Cluster.id == cid)).scalar()
    if n == 0:
        session.execute(sa.delete(models.ClusterMember).where(
            models.ClusterMember.cluster_id == cid))
        session.execute(sa.delete(models.Cluster).where(
            models.Cluster.id == cid))


def _relabel(session, cid, members):
    """Give cluster ``cid`` a new member set, keeping its fingerprints."""
    session.execute(sa.delete(models.ClusterMember).where(
        models.ClusterMember.cluster_id == cid))
    session.execute(sa.insert(models.ClusterMember), [
        {'cluster_id': cid, 'seq': m} for m in sorted(members)])
    session.execute(sa.update(models.Cluster)
                    .where(models.Cluster.id == cid)
                    .values(members_hash=members_hash(members),
                            n_images=len(members)))


def _merge_into(session, src, dst, members):
    """Move every fingerprint of cluster ``src`` into ``dst``; drop ``src``.

    ``dst`` already has the member set ``members``. The smaller cluster's
    rows are the ones updated (an index range update, no key list).
    """
    n = {c.id: c.n_fingerprints for c in session.execute(
        sa.select(models.Cluster).where(models.Cluster.id.in_(
            [src, dst]))).scalars()}
    if n[src] > n[dst]:
        # relabel the bigger one instead and drop the smaller
        session.execute(sa.delete(models.ClusterMember).where(
            models.ClusterMember.cluster_id == dst))
        session.execute(sa.update(models.Cluster).where(
            models.Cluster.id == dst).values(members_hash='merging-%d' % dst))
        src, dst = dst, src
        _relabel(session, dst, members)
    session.execute(sa.update(models.Fingerprint)
                    .where(models.Fingerprint.cluster_id == src)
                    .values(cluster_id=dst))
    _adjust_count(session, dst, n[src])
    session.execute(sa.delete(models.ClusterMember).where(
        models.ClusterMember.cluster_id == src))
    session.execute(sa.delete(models.Cluster).where(
        models.Cluster.id == src))
    return dst


def _cluster_id(session, members):
    return session.execute(sa.select(models.Cluster.id).where(
        models.Cluster.members_hash == members_hash(members))).scalar()


def _regroup(session, dialect, keys, clusters, change):
    """Move keys, grouped by their current cluster, to ``change(members)``.

    ``change`` returns the new member set, or an empty set to drop the keys.
    A cluster whose keys all move keeps its rows and changes its member set
    (merging with an existing cluster of that set), so the cost is per
    cluster, not per key; only a cluster that splits moves keys one by one.
    Returns ``(keys, cluster ids)`` of the kept keys after the change.
    """
    out_k, out_c = [], []
    ids = np.unique(clusters)
    members = cluster_members(session, ids)
    sizes = dict(session.execute(
        sa.select(models.Cluster.id, models.Cluster.n_fingerprints)
        .where(models.Cluster.id.in_([int(i) for i in ids]))).all())
    order = np.argsort(clusters, kind='stable')
    keys, clusters = keys[order], clusters[order]
    bounds = np.flatnonzero(np.diff(clusters)) + 1
    for grp_keys, grp_cl in zip(np.split(keys, bounds),
                                np.split(clusters, bounds)):
        if not len(grp_keys):
            continue
        old = int(grp_cl[0])
        new_members = change(members[old])
        dest = old
        if new_members == members[old]:
            pass
        elif len(grp_keys) == sizes[old] and not new_members:
            session.execute(sa.delete(models.Fingerprint).where(
                models.Fingerprint.cluster_id == old))
            _adjust_count(session, old, -len(grp_keys))
            _drop_if_empty(session, old)
        elif len(grp_keys) == sizes[old]:
            existing = _cluster_id(session, new_members)
            if existing is None:
                _relabel(session, old, new_members)
            else:
                dest = _merge_into(session, old, existing, new_members)
        else:
            if new_members:
                dest = _get_or_create_cluster(session, new_members)
                bulk.move(session, dialect, grp_keys, dest)
                _adjust_count(session, dest, len(grp_keys))
            else:
                bulk.delete(session, dialect, grp_keys)
            _adjust_count(session, old, -len(grp_keys))
            _drop_if_empty(session, old)
        if new_members:
            out_k.append(grp_keys)
            out_c.append(np.full(len(grp_keys), dest, dtype=np.int64))
    if not out_k:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(out_k), np.concatenate(out_c)


def add_keys(session, seq, keys):
    """Add image ``seq`` as a member for every key in ``keys`` (distinct).

    Returns the image's ``(keys, cluster ids)`` afterwards, sorted by key,
    so that map generation need not read them back.
    """
    dialect = db_session.dialect(session)
    found_k, found_c = bulk.lookup(session, dialect, keys)
    out_k, out_c = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    if len(found_k):
        k, c = _regroup(session, dialect, found_k, found_c,
                        lambda m: m | {seq})
        out_k.append(k)
        out_c.append(c)
    new = np.setdiff1d(keys, found_k, assume_unique=True)
    if len(new):
        cid = _get_or_create_cluster(session, frozenset([seq]))
        bulk.insert(session, dialect, new, cid)
        _adjust_count(session, cid, len(new))
        out_k.append(new)
        out_c.append(np.full(len(new), cid, dtype=np.int64))
    k, c = np.concatenate(out_k), np.concatenate(out_c)
    order = np.argsort(k)
    return k[order], c[order]


def remove_keys(session, seq, keys):
    """Remove image ``seq`` from the clusters of ``keys``."""
    dialect = db_session.dialect(session)
    found_k, found_c = bulk.lookup(session, dialect, keys)
    if len(found_k) != len(keys):
        raise RuntimeError('image %d has %d fingerprint keys missing from '
                           'the fingerprint table; run vmar-manage check'
                           % (seq, len(keys) - len(found_k)))
    _regroup(session, dialect, found_k, found_c, lambda m: m - {seq})


def key_clusters(session, seq):
    """All (keys, cluster_ids) of clusters that contain image ``seq``."""
    keys, clusters = bulk.fetch_pairs(
        session, 'SELECT f.fp_key, f.cluster_id FROM vmar_fingerprints f '
        'JOIN vmar_cluster_members m ON m.cluster_id = f.cluster_id '
        'WHERE m.seq = ?', (int(seq),))
    order = np.argsort(keys)
    return keys[order], clusters[order]


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


def list_images(session):
    return session.execute(sa.select(models.Image).order_by(
        models.Image.seq)).scalars().all()
