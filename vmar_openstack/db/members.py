"""The member set of a cluster row, as text and as a hash.

A cluster row lists its members (image seqs) in ``members`` and identifies
the set by ``members_hash``; these functions read and write both without
touching the database.
"""

import hashlib

import numpy as np


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
