"""Invariant checker: the tables against each other, and against the maps.

Recomputes, from every image's digest list, which images hold each
fingerprint key, and compares that with the fingerprint, cluster and member
tables (each holder a member, or a shadow holder after a public member).
Then re-reads every current map file, checks its checksum and structure,
and compares its extents with a freshly generated map.

Returns ``(problems, warnings)``: problems break an invariant; warnings are
leftovers that harm nothing, such as a map file written by a transaction
that was killed before it committed.
"""

import collections
import hashlib
import os
import tempfile

import numpy as np

from vmar_openstack.db import members as db_members
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack.ingest import paths
from vmar_openstack import mapformat
from vmar_openstack import mapgen
from vmar_openstack import names


# (key, holder) pairs compared with the index in one pass: 16 Mi pairs
# take about 0.8 GB (the pairs, their order, their clusters' codes)
PAIRS_PER_PASS = 1 << 24
# problems of single keys reported in full; the rest are counted
KEY_DETAILS = 10


def check(conf):
    problems = []
    # one state of the library: a compaction may commit meanwhile
    with db_session.reader(conf, snapshot=True) as s, \
            _spill_dir(conf) as spill:
        store = db_store.ClusterStore(s)
        images = store.list_images()
        by_seq = {i.seq: i for i in images}
        held = _spill_key_sets(store, images, spill, problems)
        problems.extend(store.index_problems())
        keys, cids = store.fingerprint_index()
        clusters = store.cluster_rows()
        members, base_problems = _member_sets(store, clusters)
        problems.extend(base_problems)
        for cid in clusters:
            for seq in sorted(members[cid] - set(by_seq)):
                problems.append('cluster %d names missing image seq %d'
                                % (cid, seq))
        shadows = _shadows(store, clusters, members, by_seq, problems)
        problems.extend(_index_against_holders(keys, cids, held, clusters,
                                               members, shadows))
        ids, n = np.unique(cids, return_counts=True)
        counts = collections.Counter(dict(zip(ids.tolist(), n.tolist())))
        for cid, c in clusters.items():
            if counts[cid] != c.n_fingerprints:
                problems.append('cluster %d counts %d fingerprints, has %d'
                                % (cid, c.n_fingerprints, counts[cid]))
            if counts[cid] == 0:
                problems.append('cluster %d is empty' % cid)
            if c.members_hash != db_members.members_hash(members[cid]):
                problems.append('cluster %d members_hash is stale' % cid)
            if c.n_images != len(members[cid]):
                problems.append('cluster %d n_images is stale' % cid)
            public = [m for m in members[cid] if m in by_seq
                      and by_seq[m].visibility == 'public']
            if members[cid] and c.min_seq != min(members[cid]):
                problems.append('cluster %d min_seq %d, smallest member %d'
                                % (cid, c.min_seq, min(members[cid])))
            if c.min_public_seq != (min(public) if public else None):
                problems.append('cluster %d min_public_seq %s, smallest '
                                'public member %s' % (
                                    cid, c.min_public_seq,
                                    min(public) if public else None))
        map_problems, pending = _check_maps(conf, store, images)
        problems.extend(map_problems)
        warnings = (pending + _orphans(conf, images)
                    + _unnamed_lists(store))
    return problems, warnings


def _spill_dir(conf):
    """A temporary directory for the key sets: in ``[vmar] state_dir``.

    Or the system's, for a user who may only read the library.
    """
    try:
        return tempfile.TemporaryDirectory(prefix='.check-',
                                           dir=conf.vmar.state_dir)
    except OSError:
        return tempfile.TemporaryDirectory(prefix='vmar-check-')


def _spill_key_sets(store, images, spill, problems):
    """Each image's sorted key set, in a file of ``spill``: {seq: path}.

    The digest lists of a library of real size do not fit in memory
    together (8 MiB per GiB of virtual disk each, 30 MB an image); their
    key sets are read back a key range at a time.
    """
    held = {}
    for img in images:
        try:
            d = store.load_digests(img)
        except exception.LibraryInconsistent as e:
            problems.append(e.kwargs['what'])
            continue
        if int((~d.any(axis=1)).sum()) != img.zero_blocks:
            problems.append('image %s: zero_blocks %d does not match its '
                            'digests' % (img.image_id, img.zero_blocks))
        keys = fp_keys.image_key_set(img, d).astype(np.int64)
        if len(keys):       # (an empty file cannot be mapped)
            path = os.path.join(spill, '%d.npy' % img.seq)
            np.save(path, keys)
            held[img.seq] = path
    return held


def _key_ranges(keys, pairs):
    """Bounds ``[(lo, hi)]`` of key ranges of about PAIRS_PER_PASS pairs.

    Ranges of equal shares of the index's keys, covering every int64;
    ``hi`` None: no bound.
    """
    n = max(1, -(-pairs // PAIRS_PER_PASS))
    cuts = [int(keys[len(keys) * i // n]) for i in range(1, n)] if len(
        keys) else []
    cuts = sorted(set(cuts))
    return list(zip([None] + cuts, cuts + [None]))


def _pairs_in(held, lo, hi):
    """The (key, holder seq) pairs of keys in ``[lo, hi)``, by key."""
    ks, ss = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for seq, path in held.items():
        a = np.load(path, mmap_mode='r')
        i = 0 if lo is None else int(np.searchsorted(a, lo))
        j = len(a) if hi is None else int(np.searchsorted(a, hi))
        ks.append(np.array(a[i:j]))
        ss.append(np.full(j - i, seq, np.int64))
    ks, ss = np.concatenate(ks), np.concatenate(ss)
    order = np.argsort(ks, kind='stable')
    return ks[order], ss[order]


def _codes(sets):
    """Sorted ``cluster << 32 | seq`` of ``{cluster: seqs}``."""
    out = [np.empty(0, np.int64)]
    for cid, seqs in sets.items():
        if seqs:
            out.append((np.int64(cid) << 32)
                       | np.fromiter(seqs, np.int64, len(seqs)))
    return np.sort(np.concatenate(out))


def _index_against_holders(keys, cids, held, clusters, members, shadows):
    """The index's keys against the images that hold them, as problems.

    Each key of an image is in the index, in a cluster that exists, whose
    members all hold it, and every other holder is a shadow holder of
    that cluster; each key of the index is some image's. One key range of
    ``(key, holder)`` pairs at a time (:data:`PAIRS_PER_PASS`), from the
    key sets :func:`_spill_key_sets` wrote.
    """
    problems, extra = [], collections.Counter()

    def detail(kind, text):
        """A key's problem: ``text()`` for the first KEY_DETAILS."""
        if len(problems) < KEY_DETAILS:
            problems.append(text())
        else:
            extra[kind] += 1
    ids = np.fromiter(sorted(clusters), np.int64, len(clusters))
    n_members = np.fromiter((len(members[c]) for c in ids.tolist()),
                            np.int64, len(ids))
    member_codes, shadow_codes = _codes(members), _codes(shadows)
    pairs = sum(int(np.load(p, mmap_mode='r').shape[0])
                for p in held.values())
    missing = 0
    for lo, hi in _key_ranges(keys, pairs):
        ek, es = _pairs_in(held, lo, hi)
        r0 = 0 if lo is None else int(np.searchsorted(keys, lo))
        r1 = len(keys) if hi is None else int(np.searchsorted(keys, hi))
        rk, rc = keys[r0:r1], cids[r0:r1]
        # the row of each pair's key (rows are distinct, by key)
        pos = np.minimum(np.searchsorted(rk, ek), max(0, len(rk) - 1))
        in_index = (rk[pos] == ek) if len(rk) else np.zeros(len(ek), bool)
        missing += len(np.unique(ek[~in_index]))
        held_rows = np.zeros(len(rk), bool)
        held_rows[pos[in_index]] = True
        c_at = np.minimum(np.searchsorted(ids, rc), max(0, len(ids) - 1))
        known = (ids[c_at] == rc) if len(ids) else np.zeros(len(rc), bool)
        for k, c in zip(rk[~known].tolist(), rc[~known].tolist()):
            detail('in a missing cluster', lambda k=k, c=c: (
                'fingerprint %d points to missing cluster %d' % (k, c)))
        for k in rk[known & ~held_rows].tolist():
            detail('held by no image',
                   lambda k=k: 'fingerprint %d is in no image' % k)
        # each pair of a key in a cluster that exists: member, shadow,
        # or neither (a wrong holder)
        p_row = pos[in_index]
        ok = known[p_row]
        p_row, p_seq = p_row[ok], es[in_index][ok]
        code = (rc[p_row] << 32) | p_seq
        is_member = np.isin(code, member_codes)
        stray = ~is_member & ~np.isin(code, shadow_codes)
        n_held = np.bincount(p_row[is_member], minlength=len(rk))
        want = np.where(known, n_members[c_at], 0) if len(ids) else (
            np.zeros(len(rk), np.int64))
        bad = known & held_rows & (n_held != want)
        bad[p_row[stray]] = True
        for r in np.flatnonzero(bad).tolist():
            c = int(rc[r])
            detail('held by others than their cluster', lambda r=r, c=c: (
                'fingerprint %d is in cluster %s (shadow holders %s) but '
                'in images %s' % (int(rk[r]), sorted(members[c]),
                                  sorted(shadows[c]),
                                  sorted(p_seq[p_row == r].tolist()))))
    for kind, n in sorted(extra.items()):
        problems.append('%d more fingerprint keys %s' % (n, kind))
    if missing:
        problems.append('%d fingerprint keys of images are missing from '
                        'the fingerprint table' % missing)
    return problems


def _unnamed_lists(store):
    """Digest list objects no image names (the map GC removes them)."""
    named = {loc.split(':', 1)[-1] for loc in store.digest_locations()}
    unnamed = sorted(set(store.lists.objects()) - named)
    if not unnamed:
        return []
    return ['%d digest list objects no image names, such as %s (an add '
            'that did not commit, an image deleted or given new content: '
            'harmless; the map GC removes them after map_gc_min_age)'
            % (len(unnamed), unnamed[0])]


def _shadows(store, clusters, members, by_seq, problems):
    """Each cluster's shadow holders; problems of them.

    A shadow holder is an image that is not a member, after a public
    member of the cluster (vmar_openstack.db.store, "Shadow holders").
    """
    shadows = collections.defaultdict(set)
    for cid, seq in store.shadow_rows():
        shadows[cid].add(seq)
        if cid not in clusters:
            problems.append('shadow holder %d of missing cluster %d'
                            % (seq, cid))
        elif seq not in by_seq:
            problems.append('cluster %d names missing shadow holder %d'
                            % (cid, seq))
        elif seq in members[cid]:
            problems.append('image %d is a member and a shadow holder of '
                            'cluster %d' % (seq, cid))
        elif not any(m < seq and m in by_seq
                     and by_seq[m].visibility == 'public'
                     for m in members[cid]):
            problems.append('shadow holder %d of cluster %d has no public '
                            'member before it' % (seq, cid))
    return shadows


def _runs(text, what, problems):
    """The seqs of a member list, or None (and a problem) if unreadable."""
    try:
        listed = db_members.parse_members(text).tolist()
    except ValueError:
        problems.append('%s is unreadable: %r' % (what, text[:80]))
        return None
    if db_members.members_text(listed) != text:
        problems.append('%s %r is not in ascending runs' % (what, text[:80]))
    return set(listed)


def _member_sets(store, clusters):
    """Each cluster's member set, from its base and delta; and problems.

    A delta names only changes (no added seq its base has, no removed
    seq it lacks); each base is its set's hash, and some cluster uses it.
    """
    problems = []
    bases = {}
    for bid, (h, text) in store.member_bases().items():
        seqs = _runs(text, 'member base %d' % bid, problems)
        if seqs is not None and h != db_members.members_hash(seqs):
            problems.append('member base %d members_hash is not its '
                            'members\' hash' % bid)
        bases[bid] = seqs or set()
    used = set()
    members = collections.defaultdict(set)
    for cid, c in clusters.items():
        if c.base_id is not None and c.base_id not in bases:
            problems.append('cluster %d names missing member base %d'
                            % (cid, c.base_id))
        used.add(c.base_id)
        base = bases.get(c.base_id, set())
        added = _runs(c.added, 'cluster %d added list' % cid, problems)
        removed = _runs(c.removed, 'cluster %d removed list' % cid,
                        problems)
        if added is None or removed is None:
            continue
        if added & base or removed - base:
            problems.append('cluster %d delta names no change of its base'
                            % cid)
        members[cid] = (base | added) - removed
    for bid in sorted(set(bases) - used):
        problems.append('member base %d is used by no cluster' % bid)
    return members, problems


def _check_maps(conf, store, images):
    """Problems of the current maps; and the maps pending, as warnings."""
    problems, warnings = [], []
    pending = {p.seq: p for p in store.pending_maps()}
    resolver = mapgen.Resolver(store, conf.vmar.dedup_scope)
    for img in images:
        mv = store.map_version(img.seq, img.map_version)
        if mv is None:
            problems.append('image %s: current map v%d is not recorded'
                            % (img.image_id, img.map_version))
            continue
        path = paths.map_path(conf, img.image_id, img.map_version)
        try:
            with open(path, 'rb') as f:
                data = f.read()
        except OSError as e:
            problems.append('image %s: map %s unreadable: %s'
                            % (img.image_id, path, e.strerror))
            continue
        if hashlib.sha256(data).hexdigest() != mv.sha256:
            problems.append('image %s: map %s checksum mismatch'
                            % (img.image_id, path))
            continue
        try:
            bmap = mapformat.decode(data)
        except exception.MapFormatError as e:
            problems.append('image %s: %s' % (img.image_id, e))
            continue
        try:
            fresh = resolver.build(img)
        except exception.LibraryInconsistent as e:
            # what breaks it is reported above, by key
            problems.append('image %s: no map can be built: %s' % (
                img.image_id, e.kwargs['what']))
            continue
        if (np.array_equal(bmap.extents, fresh.extents)
                and bmap.targets == fresh.targets):
            continue
        if img.seq in pending:
            p = pending[img.seq]
            warnings.append('image %s: map v%d waits for vmar-agent to '
                            'rewrite it (after a change of image %s, %s)'
                            % (img.image_id, img.map_version, p.cause,
                               p.since))
        else:
            problems.append('image %s: map v%d is stale: the cluster tables '
                            'give a different map' % (img.image_id,
                                                      img.map_version))
    return problems, warnings


def _orphans(conf, images):
    """Map files no transaction recorded (e.g. after a kill -9)."""
    current = {(i.image_id, v)
               for i in images for v in range(1, i.map_version + 1)}
    problems = []
    try:
        files = os.listdir(conf.vmar.map_dir)
    except FileNotFoundError:
        return problems
    for name in files:
        if name.startswith('.tmp-'):
            problems.append('leftover temporary map file %s' % name)
        elif name.endswith('.vmap') and (
                names.parse_map_file(name) not in current):
            problems.append('unrecorded map file %s (harmless; remove it)'
                            % name)
    return problems
