"""The member set of a cluster row, as text and as a hash.

A cluster identifies its member set (image seqs) by ``members_hash`` and
holds it as a delta against a shared, immutable base set: the members are
those of the base (``vmar_member_bases``), plus ``added``, minus
``removed``. Adding an image to a cluster, or splitting a cluster, then
writes a few bytes however many members it has; a delta grown past
DELTA_CHARS is folded into a new base (:func:`folds`), so reading a member
set stays one base and two short lists. Every list is ascending runs of
seqs (:func:`parse_members`). These functions read and write them without
touching the database.
"""

import hashlib

import numpy as np

# A delta (added and removed, as text) longer than this is folded into a
# new base. Folding writes the whole member set once, so a cluster that
# gains members in scattered order writes its set once per ~40 members
# (six characters a seq); one that every new image joins stays one run.
DELTA_CHARS = 256


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


def toggle(hash_hex, seq):
    """The members hash of a member set with ``seq`` added or removed."""
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


def delta_add(added, removed, seq):
    """``(added, removed)`` of a delta with ``seq`` added to its set."""
    if not removed:                 # most deltas: nothing to look up
        return add_member(added, seq), removed
    gone = parse_members(removed)
    if seq in gone:
        return added, members_text(gone[gone != seq])
    return add_member(added, seq), removed


def delta_remove(added, removed, seq):
    """``(added, removed)`` of a delta with ``seq`` taken from its set."""
    if not added:
        return added, add_member(removed, seq)
    more = parse_members(added)
    if seq in more:
        return members_text(more[more != seq]), removed
    return added, add_member(removed, seq)


def folds(added, removed):
    """Whether a delta is long enough to be folded into a new base."""
    return len(added) + len(removed) > DELTA_CHARS


def resolve(base, added, removed):
    """The member seqs of base text plus ``added`` minus ``removed``.

    Ascending int64.
    """
    m = parse_members(base)
    if added:
        m = np.union1d(m, parse_members(added))
    if removed:
        m = np.setdiff1d(m, parse_members(removed), assume_unique=True)
    return m


def smallest(base, added, removed, k):
    """The ``k`` smallest seqs of base plus ``added`` minus ``removed``.

    Reads only the first runs of the base: at most as many as ``k`` plus
    the removed seqs, which can take one run's place each.
    """
    gone = parse_members(removed)
    head = ','.join(base.split(',', k + len(gone))[:k + len(gone)])
    return resolve(head, added, removed)[:k]
