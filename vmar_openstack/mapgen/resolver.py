"""Building an image's map from the cluster tables.

See the package's docstring for the rule; :class:`Resolver` applies it to
several images in one transaction, sharing the lookups.
"""

import dataclasses

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack import mapformat
from vmar_openstack.mapgen import blocks as mapgen_blocks
from vmar_openstack.mapgen import cache as mapgen_cache
from vmar_openstack.mapgen import scope as mapgen_scope


NO_CLUSTER = -1


@dataclasses.dataclass
class _Table:
    clusters: np.ndarray
    seqs: np.ndarray


@dataclasses.dataclass
class MapResult:
    targets: list
    extents: np.ndarray
    redirected_blocks: int
    mapped_blocks: int
    target_seqs: list
    # sorted distinct keys the image is its own target for (Ahead checks
    # them against clusters joined since its snapshot)
    own_keys: np.ndarray = None


class Resolver:
    """Builds maps for several images in one transaction, sharing lookups."""

    def __init__(self, store, scope, digests=None):
        self.store = store
        self.scope = scope
        self._digests = dict(digests or {})
        self._images = {}       # seq -> image row, those read so far

    def digests(self, image):
        d = self._digests.get(image.seq)
        if d is None:
            d = self.store.load_digests(image)
            self._digests[image.seq] = d
        return d

    def first(self, image, index=None):
        """The :class:`~.blocks.FirstOccurrence` table of ``image`` (cached).

        Keyed by the image's content checksum, which covers its digests,
        block size and algorithm: the table is a function of them alone.
        """
        f = mapgen_cache.FIRST_OCCURRENCES.get(image.content_sha256)
        if f is None:
            f = mapgen_blocks.FirstOccurrence(image, self.digests(image),
                                              index)
            mapgen_cache.FIRST_OCCURRENCES.put(image.content_sha256, f)
        return f

    def build(self, image, key_clusters=None, index=None):
        """Map of ``image``; ``key_clusters`` are its (keys, clusters).

        A key whose cluster is :data:`NO_CLUSTER` is held by no other image
        (for a map built before the image joins the cluster tables).
        ``index``: the image's :class:`~.blocks.BlockIndex`, if already
        made. The image's own first-occurrence table, which the maps of
        later images need, is cached on the way.
        """
        digests = self.digests(image)
        n = image.n_blocks
        index = index or mapgen_blocks.BlockIndex(image, digests)
        self.first(image, index)
        blocks, ukeys = index.blocks, index.keys
        first_idx, inverse = index.first, index.inverse
        # cluster of every key
        kc_keys, kc_clusters = key_clusters or self.store.key_clusters(
            ukeys)
        pos = np.searchsorted(kc_keys, ukeys)
        ok = pos < len(kc_keys)
        ok[ok] = kc_keys[pos[ok]] == ukeys[ok]
        if not ok.all():
            raise exception.LibraryInconsistent(
                what='image %s: %d fingerprint keys are in no cluster of '
                'the image' % (image.image_id, int((~ok).sum())))
        ucluster = kc_clusters[pos]
        imgs = self._images
        imgs[image.seq] = image
        # Resolve each distinct key through the digest of its first block:
        # round r tries each pending key's r-th candidate, one batch per
        # candidate image, so the work is per image, not per cluster.
        udig = fingerprint.take_rows(digests, blocks[first_idx])
        u_tseq = np.full(len(ukeys), -1, dtype=np.int64)
        u_tblk = np.zeros(len(ukeys), dtype=np.int64)
        table = self._candidate_table(image, imgs, fp_keys.unique(ucluster))
        row = np.searchsorted(table.clusters, ucluster)
        pending = np.arange(len(ukeys))
        for r in range(table.seqs.shape[1]):
            cand = table.seqs[row[pending], r]
            for t in fp_keys.unique(cand).tolist():
                if t < 0:
                    continue
                sel = pending[cand == t]
                if t == image.seq:
                    # udig[k] is by definition the digest of the key's
                    # first block in this image
                    u_tseq[sel] = t
                    u_tblk[sel] = blocks[first_idx[sel]]
                    continue
                found, blk = self.first(imgs[t]).find(
                    fingerprint.take_rows(udig, sel))
                u_tseq[sel[found]] = t
                u_tblk[sel[found]] = blk[found]
            pending = pending[u_tseq[pending] < 0]
            if not len(pending):
                break
        # Keys found neither in the smallest candidate nor in the image
        # itself at the first try (possible only after a key collision):
        # try every candidate of their cluster in order.
        for cid in fp_keys.unique(ucluster[pending]).tolist():
            sel = pending[ucluster[pending] == cid]
            self._resolve(sel, self._full_candidates(image, imgs, cid),
                          imgs, udig, u_tseq, u_tblk)
        b_tseq = u_tseq[inverse]
        b_tblk = u_tblk[inverse]
        # Blocks whose digest differs from the first digest of their key (a
        # key collision) are resolved on their own full digest.
        same = np.ones(len(blocks), dtype=bool)
        later = np.flatnonzero(first_idx[inverse] != np.arange(len(blocks)))
        same[later] = fingerprint.rows_equal(
            fingerprint.take_rows(digests, blocks[later]),
            fingerprint.take_rows(udig, inverse[later]))
        for i in np.flatnonzero(~same).tolist():
            one = np.array([0])
            ts, tb = np.full(1, -1, np.int64), np.zeros(1, np.int64)
            cands = self._full_candidates(image, imgs,
                                          int(ucluster[inverse[i]]))
            self._resolve(one, cands, imgs, digests[blocks[i:i + 1]], ts,
                          tb)
            b_tseq[i], b_tblk[i] = ts[0], tb[0]
        tseq = np.full(n, -1, dtype=np.int64)
        tblk = np.zeros(n, dtype=np.int64)
        tseq[blocks] = b_tseq
        tblk[blocks] = b_tblk
        if image.virtual_size % image.block_size and digests[-1].any():
            tseq[-1], tblk[-1] = image.seq, n - 1
        result = self._extents(image, imgs, tseq, tblk)
        result.own_keys = ukeys[u_tseq == image.seq]
        return result

    def register(self, image):
        """Make ``image`` known without reading it (not in the library yet)."""
        self._images[image.seq] = image

    def _load(self, seqs):
        """Read the rows of those of image ``seqs`` not read yet.

        Only the images a map reads from are read, never the whole
        library: the work of a map does not grow with the library.
        """
        want = {int(s) for s in seqs} - set(self._images)
        want.discard(-1)
        if want:
            self._images.update(self.store.images_by_seq(want))
        return self._images

    def _allowed(self, image, seqs):
        """Mask of those of ``seqs`` (int64 array) ``image`` may read."""
        imgs = self._load(fp_keys.unique(seqs).tolist())
        may = mapgen_scope.may_redirect
        ok = {s for s in fp_keys.unique(seqs).tolist()
              if s in imgs and may(image, imgs[s], self.scope)}
        return fp_keys.isin(seqs, np.array(sorted(ok), dtype=np.int64))

    def _candidate_table(self, image, imgs, clusters):
        """Candidates of each cluster of ``image``, smallest seq first.

        Returns ``clusters`` (sorted ids) and ``seqs``, a matrix with one
        row per cluster: the smallest member ``image`` may read from, then
        ``image`` itself (padded with -1). The full member lists are read
        only for keys that match neither (:meth:`_full_candidates`).

        The smallest allowed member comes from the cluster row, whose
        smallest member and smallest public member are kept up to date, so
        that the cost does not grow with the number of members. Only images
        that are neither public nor allowed in every scope (other private
        images of the same owner) are looked up in the member table, and
        only those whose seq is below the answer so far.
        """
        clusters = np.asarray(clusters, dtype=np.int64)
        real = clusters >= 0      # NO_CLUSTER: keys new to the library
        cl, low, low_pub = self.store.cluster_minima(clusters[real])
        pos = np.searchsorted(clusters, cl)
        if len(cl) != real.sum() or not np.array_equal(clusters[pos], cl):
            raise exception.LibraryInconsistent(
                what='image %s: some of its clusters are missing'
                % image.image_id)
        # the image itself holds every key of its clusters
        best = np.full(len(clusters), image.seq, np.int64)
        low_ok = self._allowed(image, low)
        pub_ok = self._allowed(image, low_pub)
        best[pos] = np.where(low_ok, low, best[pos])
        best[pos] = np.minimum(best[pos], np.where(pub_ok, low_pub,
                                                   best[pos]))
        # a public smallest member this image may not read (another block
        # size, say): the next public member may qualify; read the lists
        exact = np.zeros(len(clusters), dtype=bool)
        exact[pos] = (low_pub >= 0) & ~pub_ok & (best[pos] > low_pub)
        others = self._private_readable(image, int(best.max(initial=-1)))
        todo = real & ~exact & (best > (others[0] if len(others) else best))
        if todo.any():
            # the member lists of those clusters, for their smallest member
            # among the owner's other images
            lists = self.store.member_lists(clusters[todo])
            for i in np.flatnonzero(todo).tolist():
                m = lists[int(clusters[i])]
                m = m[fp_keys.isin(m, others)]
                if len(m):
                    best[i] = min(best[i], int(m.min()))
        for i in np.flatnonzero(exact).tolist():
            cands = self._full_candidates(image, imgs, int(clusters[i]))
            if cands:
                best[i] = min(best[i], cands[0])
        seqs = np.full((len(clusters), 2), -1, dtype=np.int64)
        seqs[:, 0] = best
        seqs[seqs[:, 0] != image.seq, 1] = image.seq
        self._load(fp_keys.unique(seqs.ravel()).tolist())
        return _Table(clusters, seqs)

    def _private_readable(self, image, below):
        """Private images before ``below`` that ``image`` may read, sorted.

        Under ``project`` scope, its owner's other images; under ``global``
        every cluster's smallest member is readable already, and under
        ``public`` no other private image is: none to look for.
        """
        if self.scope != 'project' or image.owner is None:
            return np.zeros(0, dtype=np.int64)
        return self.store.private_seqs(image, below)

    def _full_candidates(self, image, imgs, cluster):
        """Every member of ``cluster`` that ``image`` may read, ascending.

        The image itself is one, whether or not it is a member yet.
        """
        members = self.store.member_lists([cluster]).get(
            cluster, np.zeros(0, dtype=np.int64))
        members = members[self._allowed(image, members)]
        return sorted(set(members.tolist()) | {image.seq})

    def _resolve(self, grp, cands, imgs, udig, u_tseq, u_tblk):
        pending = grp
        for s in cands:
            found, blk = self.first(imgs[s]).find(udig[pending])
            u_tseq[pending[found]] = s
            u_tblk[pending[found]] = blk[found]
            pending = pending[~found]
            if not len(pending):
                return
        raise exception.LibraryInconsistent(
            what='a digest of image %d is not in the image itself'
            % cands[-1])

    def _extents(self, image, imgs, tseq, tblk):
        mapped = np.flatnonzero(tseq >= 0)
        target_seqs = fp_keys.unique(tseq[mapped]).tolist()
        imgs = self._load(target_seqs)
        targets = [mapformat.Target(imgs[s].image_id, imgs[s].virtual_size,
                                    s == image.seq) for s in target_seqs]
        if not len(mapped):
            extents = np.zeros(0, dtype=mapformat.EXTENT_DTYPE)
        else:
            t = tseq[mapped]
            b = tblk[mapped]
            brk = np.ones(len(mapped), dtype=bool)
            brk[1:] = ((np.diff(mapped) != 1) | (np.diff(t) != 0)
                       | (np.diff(b) != 1))
            starts = np.flatnonzero(brk)
            lengths = np.diff(np.append(starts, len(mapped)))
            extents = np.zeros(len(starts), dtype=mapformat.EXTENT_DTYPE)
            extents['src'] = mapped[starts]
            extents['length'] = lengths
            extents['target_block'] = b[starts]
            lut = np.array(target_seqs, dtype=np.int64)
            extents['target'] = np.searchsorted(lut, t[starts])
        redirected = int(((tseq[mapped] != image.seq)
                          | (tblk[mapped] != mapped)).sum())
        if not targets:
            # an all-zero image still names itself, as the spec requires
            targets = [mapformat.Target(image.image_id, image.virtual_size,
                                        True)]
            target_seqs = [image.seq]
        return MapResult(targets, extents, redirected, len(mapped),
                         target_seqs)
