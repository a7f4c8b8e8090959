"""vmar-manage check: the index against the images that hold its keys.

The checker reads the key sets back one key range at a time
(:data:`check.PAIRS_PER_PASS`), so each break is looked for in one pass
and in many.
"""

import os
import tempfile

import fixtures
import sqlalchemy as sa

from tests import base
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack.ingest import check


def _uuid(n):
    return '%08d-0000-4000-8000-%012d' % (n, n)


TIERS = (models.Fingerprint, models.RecentFingerprint)


class TestCheckIndex(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        for n, seeds, kw in ((1, range(1, 9), {'visibility': 'public'}),
                             (2, range(5, 13), {'owner': 'p'}),
                             (3, range(20, 25), {'owner': 'q'})):
            self.lib.add(_uuid(n), self.image('i%d' % n, seeds), **kw)
        self.assertEqual([], check.check(self.conf)[0])

    def passes(self):
        """Run the test's checks in one pass, then in passes of 3 pairs."""
        yield 'one pass'
        self.useFixture(fixtures.MockPatchObject(check, 'PAIRS_PER_PASS', 3))
        yield 'passes of 3 pairs'

    def _rows(self):
        """{key: (tier model, cluster id)} and {cluster: member seqs}."""
        with db_session.reader(self.conf) as s:
            rows = {k: (t, c) for t in TIERS for k, c in s.execute(
                sa.select(t.fp_key, t.cluster_id)).all()}
            members = db_store.ClusterStore(s).cluster_members(
                {c for _t, c in rows.values()})
        return rows, members

    def _seq(self, n):
        with db_session.reader(self.conf) as s:
            return s.execute(sa.select(models.Image.seq).where(
                models.Image.image_id == _uuid(n))).scalar()

    def _key_of(self, *seqs):
        rows, members = self._rows()
        return next(k for k, (t, c) in sorted(rows.items())
                    if members[c] == frozenset(seqs))

    def _set(self, key, cluster):
        rows, _m = self._rows()
        tier = rows[key][0]
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.update(tier).where(tier.fp_key == key).values(
                cluster_id=cluster))

    def test_a_healthy_library_in_one_pass_and_in_many(self):
        rows, _m = self._rows()
        keys = sorted(rows)
        # passes of 3 pairs: a range per few keys, covering every key
        self.useFixture(fixtures.MockPatchObject(check, 'PAIRS_PER_PASS', 3))
        ranges = check._key_ranges(keys, 3 * len(keys))
        self.assertGreater(len(ranges), 2)
        self.assertEqual((None, None), (ranges[0][0], ranges[-1][1]))
        self.assertEqual([hi for _lo, hi in ranges[:-1]],
                         [lo for lo, _hi in ranges[1:]])
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_key_in_no_image(self):
        rows, _m = self._rows()
        tier, cid = rows[self._key_of(self._seq(3))]
        stray = max(rows) + 1
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.insert(tier).values(fp_key=stray, cluster_id=cid))
        for how in self.passes():
            problems = check.check(self.conf)[0]
            self.assertIn('fingerprint %d is in no image' % stray, problems,
                          how)

    def test_a_key_in_a_cluster_its_holders_are_not_members_of(self):
        a, c = self._seq(1), self._seq(3)
        key = self._key_of(a)
        _t, other = self._rows()[0][self._key_of(c)]
        self._set(key, other)
        for how in self.passes():
            problems = check.check(self.conf)[0]
            # its holders: a, and any shadow holder of a's cluster
            said = 'fingerprint %d is in cluster [%d] (shadow holders []) ' \
                'but in images [%d' % (key, c, a)
            self.assertTrue([p for p in problems if p.startswith(said)],
                            (how, problems))

    def test_a_key_of_a_missing_cluster(self):
        key = self._key_of(self._seq(3))
        self._set(key, 99999)
        for how in self.passes():
            problems = check.check(self.conf)[0]
            self.assertIn('fingerprint %d points to missing cluster 99999'
                          % key, problems, how)

    def test_a_key_missing_from_the_index(self):
        key = self._key_of(self._seq(3))
        tier = self._rows()[0][key][0]
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.delete(tier).where(tier.fp_key == key))
        for how in self.passes():
            problems = check.check(self.conf)[0]
            self.assertIn('1 fingerprint keys of images are missing from '
                          'the fingerprint table', problems, how)

    def test_past_the_details_keys_are_counted(self):
        self.useFixture(fixtures.MockPatchObject(check, 'KEY_DETAILS', 1))
        rows, _m = self._rows()
        tier, cid = rows[self._key_of(self._seq(3))]
        first = max(rows) + 1
        with db_session.locked_writer(self.conf) as s:
            for k in range(first, first + 3):
                s.execute(sa.insert(tier).values(fp_key=k, cluster_id=cid))
        for how in self.passes():
            problems = check.check(self.conf)[0]
            self.assertIn('fingerprint %d is in no image' % first, problems,
                          how)
            self.assertIn('2 more fingerprint keys held by no image',
                          problems, how)
            self.assertNotIn('fingerprint %d is in no image' % (first + 1),
                             problems, how)

    def test_the_key_sets_leave_with_the_check(self):
        check.check(self.conf)
        self.assertEqual([], [n for n in os.listdir(self.tmp)
                              if n.startswith('.check-')])

    def test_a_reader_who_may_not_write_the_state_dir(self):
        real = tempfile.TemporaryDirectory
        used = []

        def temp(prefix=None, dir=None):
            if dir is not None:
                raise PermissionError(13, 'Permission denied', dir)
            used.append(prefix)
            return real(prefix=prefix)
        self.useFixture(fixtures.MockPatchObject(
            check.tempfile, 'TemporaryDirectory', temp))
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual(['vmar-check-'], used)
