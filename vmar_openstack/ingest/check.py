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


def check(conf):
    problems = []
    # one state of the library: a compaction may commit meanwhile
    with db_session.reader(conf, snapshot=True) as s:
        store = db_store.ClusterStore(s)
        images = store.list_images()
        by_seq = {i.seq: i for i in images}
        digests = {}
        expected = collections.defaultdict(set)   # key -> member seqs
        for img in images:
            try:
                d = store.load_digests(img)
            except exception.LibraryInconsistent as e:
                problems.append(e.kwargs['what'])
                continue
            digests[img.seq] = d
            if int((~d.any(axis=1)).sum()) != img.zero_blocks:
                problems.append('image %s: zero_blocks %d does not match its '
                                'digests' % (img.image_id, img.zero_blocks))
            for k in fp_keys.image_key_set(img, d).tolist():
                expected[k].add(img.seq)
        problems.extend(store.index_problems())
        rows = store.fingerprint_rows()
        clusters = store.cluster_rows()
        members, base_problems = _member_sets(store, clusters)
        problems.extend(base_problems)
        for cid in clusters:
            for seq in sorted(members[cid] - set(by_seq)):
                problems.append('cluster %d names missing image seq %d'
                                % (cid, seq))
        shadows = _shadows(store, clusters, members, by_seq, problems)
        counts = collections.Counter()
        actual_keys = set()
        for key, cid in rows:
            actual_keys.add(key)
            counts[cid] += 1
            if cid not in clusters:
                problems.append('fingerprint %d points to missing cluster %d'
                                % (key, cid))
                continue
            want = expected.get(key)
            if want is None:
                problems.append('fingerprint %d is in no image' % key)
            elif not members[cid] <= want or (
                    want - members[cid] - shadows[cid]):
                problems.append('fingerprint %d is in cluster %s (shadow '
                                'holders %s) but in images %s' % (
                                    key, sorted(members[cid]),
                                    sorted(shadows[cid]), sorted(want)))
        missing = set(expected) - actual_keys
        if missing:
            problems.append('%d fingerprint keys of images are missing from '
                            'the fingerprint table' % len(missing))
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
    pending = {row[0]: row[2:] for row in store.pending_maps()}
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
        fresh = resolver.build(img)
        if (np.array_equal(bmap.extents, fresh.extents)
                and bmap.targets == fresh.targets):
            continue
        if img.seq in pending:
            cause, since = pending[img.seq]
            warnings.append('image %s: map v%d waits for vmar-agent to '
                            'rewrite it (after a change of image %s, %s)'
                            % (img.image_id, img.map_version, cause, since))
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
