"""The reports of compute hosts: what each one exports and holds.

``vmar-export serve`` sends its host's exports every ``[vmar_host]
report_interval`` seconds; ``vmar-agent`` records the last report of each
host here (``vmar_hosts``, ``vmar_host_exports``, ``vmar_host_bases``),
stamped with the time the agent received it. A host's last report stands
until it reports again or an operator forgets it: a host that is down
still holds what its instances use.

:meth:`HostReports.shares` is what the scheduler's ``vmar`` weigher asks:
the share of an image's canonical blocks each host holds.
:meth:`HostReports.holders` is what vmar-agent tells a host that misses
blocks of a base: the hosts that hold them and serve peers.
"""

import dataclasses
import datetime
import enum
import hashlib
import json

import sqlalchemy as sa
from sqlalchemy.ext import compiler as sa_compiler

from vmar_openstack.db import models
from vmar_openstack.db import session as db_session


class _joined(sa.sql.functions.GenericFunction):
    """The strings of a group joined with ``,``, as one string."""
    type = sa.String()
    inherit_cache = True


@sa_compiler.compiles(_joined)
def _group_concat(element, compiler, **kw):     # MariaDB, SQLite
    return 'group_concat(%s)' % compiler.process(element.clauses, **kw)


@sa_compiler.compiles(_joined, 'postgresql')
def _string_agg(element, compiler, **kw):
    return "string_agg(%s, ',')" % compiler.process(element.clauses, **kw)


def _exact(column):
    """A float column as text that reads back as the value it holds.

    Through a double: MariaDB writes a ``FLOAT`` as text with 6 digits.
    """
    return sa.cast(sa.cast(column, sa.Double), sa.String)


def _older(report, order):
    """Whether a report ``order`` came before the recorded ``report``.

    Only reports of one run of the host's vmar-export are ordered: a new
    run (a restart) or a report that says nothing is taken as newer.
    """
    return (report is not None and order is not None
            and report.report_run == order[0]
            and report.report_seq is not None and order[1] < report.report_seq)


class Recorded(enum.IntEnum):
    """What :meth:`HostReports.record` did with a report (false: nothing)."""
    OLDER = 0        # a later report of the host's run is recorded
    WRITTEN = 1      # its rows written
    UNCHANGED = 2    # it said what the last one said: its host's row moved


def _digest(rows, holds, complete, peer_address, epoch):
    """What a report's rows say, under the library's maps ``epoch``.

    Two reports of a host with one digest write the same rows: the
    exports, the holds (None: the report said nothing of them), the
    complete mirrors and the peer server, and the shares computed from
    them, which only a maps change (:func:`session.maps_changed`) moves.
    """
    said = [rows, None if holds is None else sorted(
        (str(b), None if n is None else int(n)) for b, n in holds.items()),
        sorted(complete), peer_address, epoch]
    return hashlib.sha256(json.dumps(said).encode()).hexdigest()


def _stamp(report, order, reported_at, load_per_cpu):
    """Set what every report of a host moves on its row."""
    report.report_run, report.report_seq = order or (None, None)
    report.reported_at = reported_at or models.utcnow()
    report.load_per_cpu = load_per_cpu


@dataclasses.dataclass(frozen=True)
class Host:
    host: str
    reported_at: datetime.datetime
    exports: tuple             # ((image_id, map_version), ...), sorted
    holds: tuple = ()          # ((base_id, blocks or None), ...), sorted
    peer_address: str = None   # its peer server, "host:port", or None
    load_per_cpu: float = None
    complete: tuple = ()       # (base_id, ...) of complete mirrors, sorted


@dataclasses.dataclass(frozen=True)
class Holder:
    """A host that holds blocks of a base and serves peers (holders())."""
    host: str
    peer_address: str          # "host:port"
    blocks: int                # None: the whole base
    load_per_cpu: float        # None: not reported


class HostReports:
    """The ``vmar_hosts`` and ``vmar_host_exports`` tables."""

    def __init__(self, conf):
        self.conf = conf

    # the first reports of one host at once race for its row: the loser
    # runs again and finds it
    @db_session.retry_conflicts(
        also=lambda e: isinstance(e, sa.exc.IntegrityError))
    def record(self, host, exports, holds=None, reported_at=None,
               peer_address=None, load_per_cpu=None, complete=(),
               order=None):
        """Replace ``host``'s report; a :class:`Recorded`, false if older.

        ``exports``: ``(image id, map version)`` pairs; ``holds``: ``{base
        id: blocks held, None for a whole base}`` (None: the report said
        nothing of it; what the host last said stands). ``peer_address``:
        where it serves peers (None: it does not), ``load_per_cpu``: its
        load then. ``complete``: the bases among ``holds`` whose mirror
        holds every block only the base's image has
        (:meth:`vmar_openstack.host.exports.hostdir.Layout.complete_mirrors`).
        ``order``: ``(run, number)`` of the report in its host's
        vmar-export (None: not said); a report of the run recorded last
        with a lower number is older, and is not recorded.

        A report that says what the host's last one said, with no maps
        change between them (most of them: a host reports every
        ``report_interval``), moves the row's time, order and load alone:
        three statements where a whole report writes about twenty.
        """
        complete = {str(b) for b in complete or ()}
        rows = sorted({(str(i), int(v)) for i, v in exports})
        # not under the library lock: a thousand hosts' reports must not
        # queue behind an ingest's commit, nor make it redo its lookups.
        # Two reports of one host take turns on its row.
        with db_session.writer(self.conf) as s:
            report = s.execute(
                sa.select(models.HostReport)
                .where(models.HostReport.host == host)
                .with_for_update()).scalar_one_or_none()
            if _older(report, order):
                return Recorded.OLDER
            digest = _digest(rows, holds, complete, peer_address,
                             db_session.maps_epoch(s))
            if report is not None and report.report_digest == digest:
                _stamp(report, order, reported_at, load_per_cpu)
                return Recorded.UNCHANGED
            s.execute(sa.delete(models.HostExport).where(
                models.HostExport.host == host))
            if holds is not None:
                s.execute(sa.delete(models.HostBase).where(
                    models.HostBase.host == host))
            if report is None:
                report = models.HostReport(host=host)
                s.add(report)
            _stamp(report, order, reported_at, load_per_cpu)
            report.peer_address = peer_address
            # written with the rows: a failure leaves neither
            report.report_digest = digest
            s.flush()
            s.add_all(models.HostExport(host=host, image_id=i, map_version=v)
                      for i, v in rows)
            if holds is not None:
                s.add_all(models.HostBase(
                    host=host, base_id=str(b),
                    blocks=None if n is None else int(n),
                    complete=str(b) in complete)
                    for b, n in holds.items())
            s.flush()
            self._record_shares(s, host, holds)
        return Recorded.WRITTEN

    def _record_shares(self, s, host, holds):
        """Rewrite ``host``'s rows of ``vmar_host_shares`` from its report.

        Per base: 1 for a whole copy, the blocks of its mirror over the
        base's canonical blocks, or what an exported map version reads
        from it over the same, whichever is larger (at most 1). A base
        the library forgot counts only as a whole copy. The weigher sums
        these (:meth:`shares`) instead of the report's rows. ``holds``:
        the report's (None: the host's rows stand).
        """
        hb, he, mt = models.HostBase, models.HostExport, models.MapTarget
        s.execute(sa.delete(models.HostShare).where(
            models.HostShare.host == host))
        bases = s.execute(sa.select(hb.base_id, hb.blocks).where(
            hb.host == host)).all() if holds is None else [
                (str(b), n) for b, n in holds.items()]
        read = s.execute(
            sa.select(mt.target_id, sa.func.max(mt.blocks))
            .select_from(he)
            .join(models.Image, models.Image.image_id == he.image_id)
            .join(mt, sa.and_(mt.seq == models.Image.seq,
                              mt.version == he.map_version))
            .where(he.host == host).group_by(mt.target_id)).all()
        data = self._canonical_blocks(
            s, sorted({b for b, _n in bases} | {t for t, _n in read}))
        share = {}
        for base, blocks in list(bases) + list(read):
            if blocks is None:
                f = 1.0
            elif data.get(base):
                f = min(1.0, blocks / data[base])
            else:
                continue
            share[base] = max(share.get(base, 0.0), f)
        s.add_all(models.HostShare(host=host, base_id=b, share=f)
                  for b, f in share.items() if f > 0)

    def list(self):
        with db_session.reader(self.conf) as s:
            reports = s.execute(sa.select(models.HostReport).order_by(
                models.HostReport.host)).scalars().all()
            held, holds, complete = {}, {}, {}
            for e in s.execute(sa.select(models.HostExport)).scalars():
                held.setdefault(e.host, []).append((e.image_id,
                                                    e.map_version))
            for b in s.execute(sa.select(models.HostBase)).scalars():
                holds.setdefault(b.host, []).append((b.base_id, b.blocks))
                if b.complete:
                    complete.setdefault(b.host, []).append(b.base_id)
            return [Host(r.host, r.reported_at,
                         tuple(sorted(held.get(r.host, ()))),
                         tuple(sorted(holds.get(r.host, ()))),
                         r.peer_address, r.load_per_cpu,
                         tuple(sorted(complete.get(r.host, ()))))
                    for r in reports]

    def counts(self):
        """Rows of the hosts' tables: ``{table name: rows}``."""
        with db_session.reader(self.conf) as s:
            return {m.__tablename__: s.execute(
                sa.select(sa.func.count()).select_from(m)).scalar()
                for m in (models.HostReport, models.HostExport,
                          models.HostBase, models.HostShare,
                          models.FetchLead)}

    def exported(self):
        """Every ``(image id, map version)`` a host's last report lists."""
        he = models.HostExport
        with db_session.reader(self.conf) as s:
            return {(r.image_id, r.map_version) for r in s.execute(
                sa.select(he.image_id, he.map_version).distinct())}

    def exported_versions(self, image_id, peers_only=False):
        """The map versions of ``image_id`` some host's last report lists.

        ``peers_only``: only hosts that run a peer server.
        """
        he, hr = models.HostExport, models.HostReport
        q = sa.select(he.map_version).distinct().where(
            he.image_id == str(image_id))
        if peers_only:
            q = q.join(hr, hr.host == he.host).where(
                hr.peer_address.is_not(None))
        with db_session.reader(self.conf) as s:
            return set(s.execute(q).scalars())

    def complete_holders(self, base_id, max_age=None):
        """Hosts that could serve every block only ``base_id``'s image has.

        Those whose last report holds the base whole, or a complete mirror
        of it, and names a peer server; with ``max_age`` (a timedelta),
        reported within it. Host names, sorted. What nova-api asks before
        it moves a server whose image was deleted from the store.
        """
        hr, hb = models.HostReport, models.HostBase
        q = (sa.select(hr.host).join(hb, hb.host == hr.host)
             .where(hb.base_id == str(base_id),
                    hr.peer_address.is_not(None),
                    sa.or_(hb.blocks.is_(None), hb.complete.is_(True))))
        if max_age is not None:
            q = q.where(hr.reported_at >= models.utcnow() - max_age)
        with db_session.reader(self.conf) as s:
            return sorted(s.execute(q).scalars().all())

    def holders(self, base_id, exclude=None, max_age=None, limit=None):
        """The hosts a host that misses blocks of ``base_id`` should ask.

        Those whose last report holds the base (whole, or a mirror with
        some blocks) and names a peer server, not ``exclude`` (the asking
        host) and, with ``max_age`` (a timedelta), reported within it: a
        host that stopped reporting may be gone. Best first: a whole base
        before mirrors, then the least loaded, then the fuller mirror
        (seed 001 asks the least loaded neighbour that holds the chunk).
        The asker still checks by NBD block status which runs a holder
        has, and every block against its digest.
        """
        hr, hb = models.HostReport, models.HostBase
        q = (sa.select(hr.host, hr.peer_address, hr.load_per_cpu,
                       hb.blocks)
             .join(hb, hb.host == hr.host)
             .where(hb.base_id == str(base_id),
                    hr.peer_address.is_not(None),
                    sa.or_(hb.blocks.is_(None), hb.blocks > 0)))
        if exclude:
            q = q.where(hr.host != exclude)
        if max_age is not None:
            q = q.where(hr.reported_at >= models.utcnow() - max_age)
        with db_session.reader(self.conf) as s:
            rows = s.execute(q).all()
        out = sorted(
            (Holder(r.host, r.peer_address, r.blocks, r.load_per_cpu)
             for r in rows),
            key=lambda h: (h.blocks is not None,
                           float('inf') if h.load_per_cpu is None
                           else h.load_per_cpu,
                           -(h.blocks or 0), h.host))
        return out[:limit] if limit else out

    # two agents placing a host in a base's burst at once: the loser runs
    # again and finds the winner's
    @db_session.retry_conflicts(
        also=lambda e: isinstance(e, sa.exc.IntegrityError))
    def lead(self, base_id, host, ttl, fanout, name=True):
        """The host ``host`` should wait for in a burst of ``base_id``.

        A burst's hosts ask at once, and none holds anything yet. They
        take places in the order they ask (``vmar_fetch_leads``): the
        first fetches from the store, and the host at place ``i`` waits a
        moment for the runs of the one at place ``(i - 1) // fanout``, which
        fetched them from its own lead: a tree, so that no host serves
        more than ``fanout`` others while they wait
        (doc/source/admin/peers.rst, "Bursts"). A burst lasts ``ttl`` (a
        timedelta) from its first place; with none, ``host`` starts one if
        ``name``. Only hosts whose last report names a peer server take a
        place (nobody could read from the others); those others are still told
        whom to wait for. A :class:`Holder` (``blocks`` 0: what it holds is the
        reports' business), or None: ``host`` fetches first, or there is
        no burst.
        """
        fl, hr = models.FetchLead, models.HostReport
        base_id = str(base_id)
        now = models.utcnow()
        with db_session.writer(self.conf) as s:
            # the first place, locked: askers of one base take turns
            first = s.execute(sa.select(fl).where(fl.base_id == base_id)
                              .order_by(fl.seq).limit(1).with_for_update()
                              ).scalars().first()
            if first is not None and first.since < now - ttl:
                s.execute(sa.delete(fl).where(fl.base_id == base_id))
                first = None
            if first is None and not name:
                return None
            seq = s.execute(sa.select(fl.seq).where(
                fl.base_id == base_id, fl.host == host)).scalar()
            if seq is None:
                seq = 0 if first is None else s.execute(
                    sa.select(sa.func.max(fl.seq)).where(
                        fl.base_id == base_id)).scalar() + 1
                serves = s.execute(sa.select(hr.peer_address).where(
                    hr.host == host)).scalar_one_or_none()
                if serves is not None:
                    s.add(fl(base_id=base_id, host=host, since=now,
                             seq=seq))
                    s.flush()
            lead = self._lead_of(s, base_id, seq, first, fanout)
            if lead is None:
                return None
            r = s.execute(sa.select(hr.peer_address, hr.load_per_cpu).where(
                hr.host == lead)).one_or_none()
            if r is None or r.peer_address is None:
                return None
            return Holder(lead, r.peer_address, 0, r.load_per_cpu)

    @staticmethod
    def _lead_of(s, base_id, seq, first, fanout):
        """The host at the lead of place ``seq``; None for the first.

        A place whose host was forgotten (``hosts forget``) passes its
        followers on to its own lead, up to the first place left. A row
        or two per question, however many hosts a burst has.
        """
        fl = models.FetchLead
        while first is not None and seq > first.seq:
            seq = (seq - 1) // fanout
            if seq <= first.seq:
                return first.host
            host = s.execute(sa.select(fl.host).where(
                fl.base_id == base_id, fl.seq == seq)).scalar()
            if host is not None:
                return host
        return None

    def shares(self, image_id):
        """``{host: share}`` of ``image_id``'s canonical blocks each holds.

        The image's current map says how many blocks it reads from each
        base; a host holding a base whole holds all of them, a host
        holding a mirror of it is taken to hold them in the proportion of
        the base's canonical blocks (those its own map reads from itself,
        the only ones any map reads from it) its mirror holds.

        A host that exports a map version is taken to hold what that map
        reads, in the same proportion (all of it for the image itself),
        even before its guests have read it: a report sent as a server
        spawns says where its image will be, long before its mirror holds
        the blocks, so a burst of servers of one image goes together.

        Each host's share of each base is worked out when its report is
        recorded (``vmar_host_shares``): what changes in the library
        between two reports (a base deleted) shows at the next one.

        Hosts holding none of them are left out; empty if the image is
        unknown, has no map yet or its map predates the per-target counts.
        """
        with db_session.reader(self.conf) as s:
            current, need = self._reads(s, image_id)
            total = sum(need.values())
            if not total:
                return {}
            by_base = self._base_shares(s, need)
            exports = self._exports(s, image_id)
            held = {}
            for base, blocks in need.items():
                for host, f in by_base[base].items():
                    held[host] = held.get(host, 0.0) + blocks * f
            # a host serving the current map holds what it reads whole
            held.update((h, total) for h, v in exports.items()
                        if current in v)
            earlier = sorted(h for h in exports if held.get(h) != total)
            if earlier:
                self._earlier_servers(s, image_id, need, held, earlier,
                                      by_base)
        return {h: float(v) / total for h, v in held.items() if v > 0}

    @staticmethod
    def _reads(s, image_id):
        """``(current map version, {base id: blocks it reads from it})``.

        ``(None, {})`` for an unknown image or one without a map.
        """
        im, mt = models.Image, models.MapTarget
        rows = s.execute(
            sa.select(im.map_version, mt.target_id, mt.blocks)
            .join(mt, sa.and_(mt.seq == im.seq,
                              mt.version == im.map_version))
            .where(im.image_id == image_id)).all()
        if not rows:
            return None, {}
        return rows[0].map_version, {r.target_id: r.blocks for r in rows}

    # The weigher's reads return a row per group, its members joined in
    # one string, not a row per host: at a thousand hosts the driver's
    # parsing of a row per holder, and the database's grouping by host,
    # were most of a lookup (issue 35, bench/bench_scale.py hosts). A
    # group whose string does not hold as many members as it counts (a
    # name with the separators in it, MariaDB's group_concat_max_len) is
    # read row by row.

    @staticmethod
    def _base_shares(s, base_ids):
        """``{base id: {host: share}}``: each host's share of each base.

        Hosts holding none of a base are left out. Read from the index on
        ``(base_id, host, share)`` alone.
        """
        hs = models.HostShare
        out = {b: {} for b in base_ids}
        for base, n, text in s.execute(
                sa.select(hs.base_id, sa.func.count(),
                          _joined(hs.host + ' ' + _exact(hs.share)))
                .where(hs.base_id.in_(list(base_ids)))
                .group_by(hs.base_id)).all():
            pairs = [p.split(' ') for p in text.split(',')]
            if len(pairs) == n and all(len(p) == 2 for p in pairs):
                out[base] = {h: float(f) for h, f in pairs}
            else:
                out[base] = dict(s.execute(
                    sa.select(hs.host, hs.share)
                    .where(hs.base_id == base)).all())
        return out

    def base_shares(self, base_ids):
        """``{base id: {host: share}}``: each host's share of each base."""
        with db_session.reader(self.conf) as s:
            return self._base_shares(s, base_ids)

    @staticmethod
    def _exports(s, image_id):
        """``{host: {map versions}}`` of the hosts exporting the image."""
        he = models.HostExport
        out = {}
        for version, n, text in s.execute(
                sa.select(he.map_version, sa.func.count(), _joined(he.host))
                .where(he.image_id == image_id)
                .group_by(he.map_version)).all():
            hosts = text.split(',')
            if len(hosts) != n:
                hosts = s.execute(sa.select(he.host).where(
                    he.image_id == image_id,
                    he.map_version == version)).scalars().all()
            for host in hosts:
                out.setdefault(host, set()).add(version)
        return out

    @staticmethod
    def _earlier_servers(s, image_id, need, held, hosts, by_base):
        """Hosts exporting only earlier map versions of the image.

        Rare (servers started before the image's map changed): each holds
        whole what its versions read from each base, and its share of the
        other bases.
        """
        he, mt, im = models.HostExport, models.MapTarget, models.Image
        read = {}
        for host, target in s.execute(
                sa.select(he.host, mt.target_id)
                .join(im, im.image_id == he.image_id)
                .join(mt, sa.and_(mt.seq == im.seq,
                                  mt.version == he.map_version))
                .where(he.image_id == image_id, he.host.in_(hosts),
                       mt.target_id.in_(list(need)))).all():
            read.setdefault(host, set()).add(target)
        for host in hosts:
            targets = read.get(host, set())
            held[host] = sum(
                n * (1.0 if t in targets else
                     by_base.get(t, {}).get(host, 0.0))
                for t, n in need.items())

    @staticmethod
    def _canonical_blocks(session, image_ids):
        """``{image id: blocks its current map reads from itself}``.

        Maps written before the per-target counts: its data blocks.
        """
        img, mt = models.Image, models.MapTarget
        return dict(session.execute(
            sa.select(img.image_id, sa.func.coalesce(
                mt.blocks, img.n_blocks - img.zero_blocks))
            .outerjoin(mt, sa.and_(mt.seq == img.seq,
                                   mt.version == img.map_version,
                                   mt.target_id == img.image_id))
            .where(img.image_id.in_(image_ids))).all())

    def forget(self, host):
        """Drop a host's report; whether there was one."""
        with db_session.writer(self.conf) as s:
            s.execute(sa.delete(models.HostShare).where(
                models.HostShare.host == host))
            s.execute(sa.delete(models.HostExport).where(
                models.HostExport.host == host))
            s.execute(sa.delete(models.HostBase).where(
                models.HostBase.host == host))
            s.execute(sa.delete(models.FetchLead).where(
                models.FetchLead.host == host))
            return s.execute(sa.delete(models.HostReport).where(
                models.HostReport.host == host)).rowcount > 0
