"""``vmar-agent``: Glance notifications in, ingested images and maps out.

An oslo.messaging notification listener on exchange ``glance``, topic
``notifications``, in its own pool (``[vmar_agent] pool``), so it shares no
queue with other consumers such as ceilometer:

``image.activate`` (and ``image.upload`` of an active image)
    Stream the image from Glance (python-glanceclient, which checks Glance's
    ``os_hash_value``) to a sparse temporary file, or read it in place from
    a Glance file store on this host (``[vmar_agent] local_store_dir``);
    check the format (format inspection with the claimed disk format
    pinned), ingest it, publish its map. An image
    the import plugin already ingested is only published.
``image.delete``
    Remove the image from the cluster tables, publish the regenerated maps
    of the images that pointed into it, delete its own map images but
    those hosts still export (a server moving to another host fetches its
    map there, and its blocks from the hosts that hold them; map GC
    deletes them once no host does). Old map versions of the other images
    stay in Glance: running instances use them.
``image.update``
    A change of owner or visibility changes the dedup scope: the image's
    and the affected images' maps are regenerated and published.

The agent also listens for the reports of compute hosts
(``vmar.host.exports`` on ``[vmar_reports] report_topic``, see
:mod:`vmar_openstack.host.observe.report`) and records each host's last one.
Every ``[vmar_agent] map_gc_interval`` seconds it removes the map versions
no host holds (:mod:`.gc`). From the same reports it tells hosts that read
from their peers who holds a base (RPC on ``[vmar_reports] holders_topic``,
:class:`HoldersEndpoint`).

Every ``[vmar_agent] resync_interval`` seconds the agent also compares the
library with Glance's active images (:func:`resync`): Glance's notifier
drops notifications it cannot send, so this catches up on any it missed.

Delivery is at least once: a message is acknowledged only after it was
handled, so a killed agent's work is redelivered. Every handler is
idempotent (a known image is not ingested twice; deleting an unknown image
is a no-op; publishing is idempotent). Failures are recorded in
``vmar_agent_failures`` (:mod:`vmar_openstack.db.failures`):

* an image mapgen rejects (``exception.ImageUnusable``) fails for good at
  once; only an operator retries it (``vmar-manage failures retry``);
* anything else is an outage (Glance, the database): retried with
  exponential backoff (``retry_delay``, requeued), then, after
  ``max_attempts``, parked. Parked images are retried, oldest first, as
  soon as the agent sees the outage is over: at the end of every resync
  (which has just listed Glance and read the library), and right after
  any event succeeds. The first retry that fails ends the pass.
"""

import datetime
import os
import socket
import threading
import time
import uuid

from glanceclient import exc as glance_exc
from oslo_log import log as logging
import oslo_messaging

from vmar_openstack import bus
from vmar_openstack.db import api as db_api
from vmar_openstack.db import failures as db_failures
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack.glance_hooks import gc
from vmar_openstack.glance_hooks import metrics
from vmar_openstack.glance_hooks import publish
from vmar_openstack import glance_io
from vmar_openstack import ingest
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)

INGEST_EVENTS = ('image.activate', 'image.upload')


class Handler:
    """What each event does; independent of the messaging layer."""

    def __init__(self, conf, glance, library=None):
        self.conf = conf
        self.glance = glance
        self.library = library or ingest.Library(conf)
        self.publisher = publish.Publisher(conf, glance, self.library)
        self._locks = {}
        self._locks_lock = threading.Lock()

    def _known(self, image_id):
        """(owner, visibility, map version) of a library image, or None."""
        with db_session.reader(self.conf) as s:
            img = db_api.get_image(s, image_id)
            return img and (img.owner, img.visibility, img.map_version)

    def activate(self, payload):
        image_id = payload['id']
        if payload.get('status', 'active') != 'active':
            return
        if (payload.get('properties') or {}).get(names.PROP_OF):
            return                     # one of our own map images
        if self._known(image_id) is not None and not self._snapshot_ok(
                image_id, payload):
            self.library.delete(image_id)
        if self._known(image_id) is None:
            self._ingest(image_id, payload)
        if self.publisher.current(image_id) is not None:
            self.publisher.files(image_id)

    def _snapshot_ok(self, image_id, payload):
        """Whether a snapshot built from its delta is what Glance stored.

        The import plugin entered it in the library from its parent's
        digests and the delta's (:meth:`Library.add_delta`), having
        checked every block it wrote against them, and recorded the hash
        of the file it handed Glance (``vmar_stored_hash``); Glance hashed
        what it stored (``os_hash_value``). They must agree, else the
        entry describes other bytes: it is dropped, and the image
        ingested from Glance like any other. Images without the property
        are not the plugin's snapshots: True.
        """
        claimed = (payload.get('properties') or {}).get(
            names.PROP_STORED_HASH)
        if not claimed:
            return True
        stored = self._stored_hash(image_id)
        if stored == claimed:
            return True
        metrics.SNAPSHOT_MISMATCH.inc()
        LOG.error('image %s: Glance stored %s, its delta was built into %s; '
                  'the library entry made from its parent is dropped and '
                  'the image ingested whole', image_id, stored, claimed)
        return False

    def _stored_hash(self, image_id, tries=20, pause=0.5):
        """``<os_hash_algo>:<os_hash_value>`` of an image, once recorded.

        Glance notifies ``image.upload`` from inside the import, before it
        has saved the hash it computed: a moment later it is there.

        :raises PublishError: still not there (the event is retried).
        """
        for _ in range(tries):
            meta = self.glance.images.get(image_id)
            if meta.get('os_hash_value'):
                return '%s:%s' % (meta['os_hash_algo'],
                                  meta['os_hash_value'])
            time.sleep(pause)
        raise exception.PublishError(
            image_id=image_id, reason='Glance has recorded no '
            'os_hash_value of it yet')

    def _ingest(self, image_id, payload):
        local = self._local_store_file(image_id, payload)
        if local:
            self._add(image_id, payload, local, local)
            return
        meta = self.glance.images.get(image_id)
        if meta.get(names.PROP_OF):
            return                     # one of our own map images
        if meta['status'] != 'active':
            return
        with metrics.DOWNLOAD_SECONDS.time():
            tmp = glance_io.download(self.glance, meta,
                                     self.conf.vmar.work_dir, durable=False)
        try:
            self._add(image_id, meta, tmp, 'it')
        finally:
            os.unlink(tmp)

    def _local_store_file(self, image_id, payload):
        """The image's file in a Glance file store on this host, if any."""
        store = self.conf.vmar_agent.local_store_dir
        if not store or payload.get('disk_format') is None:
            return None
        path = os.path.join(store, image_id)
        try:
            if os.path.getsize(path) == payload.get('size'):
                return path
        except OSError:
            pass
        return None

    def _add(self, image_id, meta, path, name):
        try:
            # the map image is created while the library commits
            with self.publisher.creating_ahead() as on_map_written, \
                    metrics.INGEST_SECONDS.time():
                out = self.library.add(
                    image_id, path,
                    disk_format=meta.get('disk_format') or 'raw',
                    owner=meta.get('owner'),
                    visibility=meta.get('visibility', 'private'),
                    expected_size=meta.get('size'), keep_base=False,
                    on_map_written=on_map_written)
        except exception.ImageExists:
            return                     # another agent, or the plugin
        except (exception.ImageRejected, ValueError) as e:
            raise exception.ImageUnusable(
                image_id=image_id, reason=str(e).replace(path, name))
        metrics.INGESTED_BYTES.inc(os.path.getsize(path))
        LOG.info('ingested %s: map v%d, %.1f %% shared', image_id,
                 out.map_version, 100 * out.shared_fraction)
        self.publish_regenerated(out.regenerated)

    def publish_regenerated(self, regenerated):
        for other in sorted(regenerated):
            self.publisher.current(other)

    def delete(self, payload):
        image_id = payload['id']
        if self._known(image_id) is None:
            LOG.info('image.delete of %s: not in the library', image_id)
        else:
            try:
                out = self.library.delete(image_id)
            except exception.ImageNotFound:
                out = None
            if out is not None:
                LOG.info('image.delete of %s: out of the library; %d maps '
                         'of other images rewritten, %d left pending',
                         image_id, len(out.regenerated), out.pending)
                self.publish_regenerated(out.regenerated)
        # the versions hosts that serve peers still export: a server of it
        # moving to another host fetches its map there (its blocks from
        # the hosts that hold them); map GC deletes them once no host
        # does. Without a peer server nobody could serve those blocks, and
        # nova-api refuses the move: nothing is kept.
        held = db_hosts.HostReports(self.conf).exported_versions(
            image_id, peers_only=True)
        gone = self.publisher.delete_all(image_id, keep=held)
        LOG.info('image.delete of %s: %d map images deleted', image_id, gone)

    def update(self, payload):
        image_id = payload['id']
        img = self._known(image_id)
        if img is None:
            return
        owner, vis = payload.get('owner'), payload.get('visibility')
        if (owner, vis) == img[:2]:
            return
        if vis not in db_api.VISIBILITIES:
            vis = None
        out = self.library.update_metadata(image_id, owner=owner,
                                           visibility=vis)
        self.publish_regenerated(dict(out.regenerated,
                                      **{image_id: out.map_version}))

    def dispatch(self, event_type, payload):
        # one event per image at a time in this agent: image.upload and
        # image.activate of one upload arrive together
        with self._lock_of(payload['id']):
            return self._dispatch(event_type, payload)

    def _lock_of(self, image_id):
        with self._locks_lock:
            return self._locks.setdefault(image_id, threading.Lock())

    def _dispatch(self, event_type, payload):
        if event_type in INGEST_EVENTS:
            return self.activate(payload)
        if event_type == 'image.delete':
            return self.delete(payload)
        if event_type == 'image.update':
            return self.update(payload)


def resync(conf, handler, endpoint):
    """Catch up with Glance: what notifications may have missed.

    Glance's notifier does not guarantee delivery (a notification emitted
    while RabbitMQ is unreachable is lost). Active images missing from the
    library are handled as ``image.activate``, library images gone from
    Glance as ``image.delete``, through the endpoint (so failures are
    recorded as for notifications), and known images get their digest
    list published if it is missing. Then the parked images are retried.
    """
    glance = handler.glance
    seen = set()
    for img in glance.images.list(filters={'status': 'active'}):
        if img.get(names.PROP_OF):
            continue
        seen.add(img['id'])
        if handler._known(img['id']) is None:
            LOG.info('resync: %s is not in the library', img['id'])
            endpoint.handle('image.activate', dict(img), once=True)
            continue
        try:
            # ingested before these files were published, or lost
            handler.publisher.files(img['id'])
        except exception.VmarException as e:
            LOG.warning('resync: %s', e)
    with db_session.reader(conf) as s:
        known = {i.image_id for i in db_api.list_images(s)}
    _finish_publications(conf, handler, known)
    for image_id in sorted(known - seen):
        try:
            glance.images.get(image_id)
            continue                   # not active (yet), or hidden
        except glance_exc.HTTPNotFound:
            pass
        LOG.info('resync: %s is gone from Glance', image_id)
        endpoint.handle('image.delete', {'id': image_id}, once=True)
    retry_parked(handler, endpoint)


def _finish_publications(conf, handler, known):
    """Publish again what a killed publisher's claim left unfinished."""
    pub = handler.publisher
    stale = pub.publications.unfinished(
        conf.vmar_agent.publish_claim_timeout)
    pub.publications.forget(p.object_id for p in stale
                            if p.image_id not in known)
    for image_id in sorted({p.image_id for p in stale} & known):
        LOG.info('resync: finishing the publication of %s, claimed by a '
                 'publisher that did not finish', image_id)
        try:
            pub.current(image_id)
            pub.files(image_id)
        except exception.VmarException as e:
            LOG.warning('resync: %s', e)


def retry(handler, endpoint, failure):
    """Handle a recorded failure's image again, now, once.

    The event is rebuilt from Glance's record of the image (an
    ``image.delete`` if Glance no longer has it). Returns the new
    :class:`~vmar_openstack.db.failures.Failure`, or None: it succeeded.
    """
    image_id, event = failure.image_id, failure.event
    payload = {'id': image_id}
    if event != 'image.delete':
        try:
            payload = dict(handler.glance.images.get(image_id))
        except glance_exc.HTTPNotFound:
            event = 'image.delete'
        except Exception as e:         # Glance still away
            return endpoint.failed(event, image_id, e, once=True,
                                   recorded=True)
        else:
            if event != 'image.update':
                event = 'image.activate'
    endpoint.handle(event, payload, once=True, force=True, recorded=True)
    return endpoint.failures.get(image_id)


def retry_parked(handler, endpoint):
    """Retry the parked images until one fails again; how many succeeded."""
    done = 0
    for f in endpoint.failures.list(state='parked'):
        LOG.info('retrying parked %s for %s (%d attempts so far)', f.event,
                 f.image_id, f.attempts)
        if retry(handler, endpoint, f) is not None:
            LOG.info('%s still fails: the outage is not over', f.image_id)
            break
        done += 1
    return done


class Endpoint:
    """The oslo.messaging notification endpoint."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type=r'^image\.(activate|upload|delete|update)$')

    def __init__(self, conf, handler):
        self.conf = conf
        self.handler = handler
        self.failures = db_failures.Failures(conf)
        # set when an event succeeded: parked images may succeed too
        self.succeeded = threading.Event()

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        delay = self.handle(event_type, payload)
        if delay is None:
            return oslo_messaging.NotificationResult.HANDLED
        time.sleep(delay)
        return oslo_messaging.NotificationResult.REQUEUE

    def handle(self, event_type, payload, once=False, force=False,
               recorded=False):
        """Dispatch one event; record its failure.

        Returns None when the event is done with (handled, skipped, given
        up or parked), else the seconds to wait before it is redelivered.
        ``once``: a failure is not redelivered but parked at once.
        ``force``: handle an image that failed for good too.
        ``recorded``: a retry of the image's recorded failure (see
        :meth:`failed`).
        """
        image_id = payload.get('id') if isinstance(payload, dict) else None
        if not image_id:
            return None
        prior = self.failures.get(image_id)
        if (prior and prior.cause == db_failures.IMAGE
                and event_type != 'image.delete' and not force):
            LOG.info('%s for %s skipped: the image failed for good',
                     event_type, image_id)
            metrics.EVENTS.labels(event_type, 'skipped').inc()
            return None
        LOG.debug('%s for %s', event_type, image_id)
        try:
            self.handler.dispatch(event_type, payload)
        except Exception as e:
            f = self.failed(event_type, image_id, e, once, recorded)
            if f is None:
                metrics.EVENTS.labels(event_type, 'skipped').inc()
                return None
            outcome = f.state if f.permanent else 'retry'
            metrics.EVENTS.labels(event_type, outcome).inc()
            if f.permanent:
                return None
            return self.conf.vmar_agent.retry_delay * 2 ** (f.attempts - 1)
        metrics.EVENTS.labels(event_type, 'done').inc()
        if prior:
            self.failures.clear(image_id)
        self.succeeded.set()
        LOG.debug('%s for %s done', event_type, image_id)
        return None

    def failed(self, event_type, image_id, error, once=False,
               recorded=False):
        """Record a failed attempt and log it; returns the Failure.

        ``recorded``: the attempt retried the image's recorded failure.
        If an operator cleared that record meanwhile (a retry of theirs
        succeeded, or they forgot the image for resync to take), the
        attempt is stale: nothing is recorded, and None returned.
        """
        cause = (db_failures.IMAGE
                 if isinstance(error, exception.ImageUnusable)
                 else db_failures.OUTAGE)
        f = self.failures.record(
            image_id, event_type, '%s: %s' % (type(error).__name__, error),
            cause, park=once, recorded=recorded)
        if f is None:
            LOG.info('%s for %s failed again, but its failure record was '
                     'cleared meanwhile: not recorded again: %s',
                     event_type, image_id, error)
        elif f.state == 'failed':
            LOG.error('%s for %s failed for good: %s', event_type, image_id,
                      error)
        elif f.state == 'parked':
            LOG.error('%s for %s failed (attempt %d), parked until the '
                      'outage is over: %s', event_type, image_id,
                      f.attempts, error)
        else:
            LOG.warning('%s for %s failed (attempt %d), retrying: %s',
                        event_type, image_id, f.attempts, error)
        return f


class HostReportEndpoint:
    """Reports of compute hosts (:mod:`vmar_openstack.host.observe.report`)."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type=r'^vmar\.host\.(exports|bootset)$')

    def __init__(self, conf, handler):
        self.reports = db_hosts.HostReports(conf)
        self.retry_delay = conf.vmar_agent.retry_delay
        self.handler = handler
        # the reports recorded at once ([vmar_agent] report_workers)
        self.slots = threading.BoundedSemaphore(
            conf.vmar_agent.report_workers)

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        if event_type == names.HOST_BOOTSET_EVENT:
            return self.bootset(publisher_id, payload)
        try:
            host = payload['host']
            exports = [(str(uuid.UUID(i)), int(v))
                       for i, v in payload['exports']]
            if not isinstance(host, str) or not host:
                raise ValueError('no host')
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            LOG.warning('malformed report from %s dropped: %s',
                        publisher_id, e)
            return oslo_messaging.NotificationResult.HANDLED
        try:
            holds = _holds(payload.get('holds'))
        except (TypeError, ValueError) as e:
            # what it holds only steers placement: keep its exports, which
            # protect map versions from collection
            LOG.warning('malformed holds in the report of %s ignored: %s',
                        host, e)
            holds = None
        try:
            complete = _complete(payload.get('complete'), holds)
        except (TypeError, ValueError, AttributeError) as e:
            LOG.warning('malformed complete mirrors in the report of %s '
                        'ignored: %s', host, e)
            complete = ()
        try:
            peer, load = _peer(payload)
        except (TypeError, ValueError) as e:
            LOG.warning('malformed peer server in the report of %s '
                        'ignored: %s', host, e)
            peer = load = None
        try:
            order = _order(payload)
        except (TypeError, ValueError) as e:
            LOG.warning('malformed order in the report of %s ignored: %s',
                        host, e)
            order = None
        try:
            done = self._record(host, exports, holds, peer_address=peer,
                                load_per_cpu=load, complete=complete,
                                order=order)
        except Exception as e:         # the database away: redeliver
            LOG.warning('report of %s not recorded: %s', host, e)
            metrics.REPORTS.labels('failed').inc()
            time.sleep(self.retry_delay)
            return oslo_messaging.NotificationResult.REQUEUE
        metrics.REPORTS.labels(done.name.lower()).inc()
        if done:
            LOG.debug('%s reports %d exports (%s)', host, len(exports),
                      done.name.lower())
        else:
            LOG.debug('report %s of %s left out: a later one is recorded',
                      order[1], host)
        return oslo_messaging.NotificationResult.HANDLED

    def _record(self, host, exports, holds, **kw):
        """Record a report once a slot of ``report_workers`` is free."""
        with metrics.REPORTS_WAITING.track_inprogress():
            self.slots.acquire()
        try:
            with metrics.REPORT_SECONDS.time():
                return self.reports.record(host, exports, holds, **kw)
        finally:
            self.slots.release()

    def bootset(self, publisher_id, payload):
        """Publish the first boot working set a host recorded."""
        try:
            image_id = str(uuid.UUID(payload['image_id']))
            data = payload['bootset'].encode()
            bset = bootset_format.decode(data, image_id)
            if bset.source != 'recorded':
                raise ValueError('a %s set' % bset.source)
        except (KeyError, TypeError, ValueError, AttributeError,
                exception.BootsetFormatError) as e:
            LOG.warning('malformed boot working set from %s dropped: %s',
                        publisher_id, e)
            return oslo_messaging.NotificationResult.HANDLED
        try:
            size = self.handler.library.virtual_size(image_id)
            if size != bset.virtual_size:
                LOG.info('boot working set of %s from %s dropped: the '
                         'image is %s', image_id, publisher_id,
                         'gone' if size is None else '%d bytes' % size)
                return oslo_messaging.NotificationResult.HANDLED
            self.handler.publisher.recorded_bootset(image_id, data)
        except Exception as e:     # Glance or the database away: redeliver
            LOG.warning('boot working set of %s not published: %s',
                        image_id, e)
            time.sleep(self.retry_delay)
            return oslo_messaging.NotificationResult.REQUEUE
        LOG.info('%s recorded the boot working set of %s: %d blocks in %d '
                 'runs', publisher_id, image_id, bset.n_blocks,
                 len(bset.extents))
        return oslo_messaging.NotificationResult.HANDLED


def _holds(items):
    """A report's ``holds`` as ``{base id: blocks or None}``.

    None if the report has none (a host of an earlier release).
    :raises ValueError, TypeError: malformed.
    """
    if items is None:
        return None
    if not isinstance(items, list):
        raise TypeError('holds: not a list')
    out = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 2
                and isinstance(item[0], str)):
            raise ValueError('holds: %r' % (item,))
        base, blocks = item
        if blocks is not None and (
                type(blocks) is not int or not 0 <= blocks < 2 ** 63):
            raise ValueError('holds: %r blocks of %s' % (blocks, base))
        out[str(uuid.UUID(base))] = blocks
    return out


def _complete(items, holds):
    """A report's ``complete``: the ids among ``holds``, a set.

    Empty if the report has none (a host of an earlier release).
    :raises ValueError, TypeError: malformed, or not held.
    """
    if items is None:
        return set()
    if not isinstance(items, list):
        raise TypeError('complete: not a list')
    out = {str(uuid.UUID(i)) for i in items}
    if out - set(holds or ()):
        raise ValueError('complete: %s not held'
                         % ', '.join(sorted(out - set(holds or ()))))
    return out


def _order(payload):
    """A report's ``(run, number)`` in its host's vmar-export, or None.

    None if the report has none (a host of an earlier release).
    :raises ValueError, TypeError: malformed.
    """
    run, seq = payload.get('run'), payload.get('seq')
    if run is None and seq is None:
        return None
    if not (isinstance(run, str) and 0 < len(run) <= 36):
        raise ValueError('run %r' % (run,))
    if type(seq) is not int or not 0 <= seq < 2 ** 63:
        raise ValueError('seq %r' % (seq,))
    return run, seq


def _peer(payload):
    """A report's peer server and load: ``(host:port, load)``, or Nones.

    :raises ValueError, TypeError: malformed.
    """
    peer = payload.get('peer')
    if peer is None:
        return None, None
    host, port = names.parse_peer_address(peer)
    load = payload.get('load')
    if load is not None:
        load = float(load)
        if not 0 <= load < 1e6:
            raise ValueError('load %r' % load)
    return names.peer_address(host, port), load


class HoldersEndpoint:
    """Who holds a base: what hosts that read from peers ask (RPC).

    The answer comes from the hosts' last reports
    (:meth:`.db.hosts.HostReports.holders`): hosts that hold blocks of the
    base and run a peer server, best first, not the asking host, and only
    those that reported within ``[vmar_agent] holder_max_age``. See
    :mod:`vmar_openstack.host.peers.discovery` and doc/source/admin/peers.rst.
    """

    target = oslo_messaging.Target(namespace=bus.HOLDERS_NAMESPACE,
                                   version=bus.HOLDERS_VERSION)

    def __init__(self, conf):
        self.reports = db_hosts.HostReports(conf)
        self.max_age = datetime.timedelta(
            seconds=conf.vmar_agent.holder_max_age)
        self.lead_ttl = datetime.timedelta(
            seconds=conf.vmar_agent.fetch_lead_seconds)
        self.fanout = conf.vmar_agent.fetch_lead_fanout

    def holders(self, ctxt, base_id, host, limit=None):
        """The holders of ``base_id``, best first, then its lead.

        The host to wait for in a burst (:meth:`.db.hosts.HostReports.
        lead`), if another, comes last with ``"lead": true``: a run no
        holder has is worth waiting a moment for there. None when a host
        holds the base whole; a burst starts only when nobody holds any of
        it.
        """
        base_id = str(uuid.UUID(base_id))
        found = self.reports.holders(base_id, exclude=host,
                                     max_age=self.max_age, limit=limit)
        out = [{'host': h.host, 'peer': h.peer_address, 'blocks': h.blocks}
               for h in found]
        lead = None
        # a whole copy serves every run: nothing to wait for
        if self.lead_ttl and all(h.blocks is not None for h in found):
            lead = self.reports.lead(base_id, host, self.lead_ttl,
                                     self.fanout, name=not found)
        if lead is not None:
            out = [h for h in out if h['host'] != lead.host] + [{
                'host': lead.host, 'peer': lead.peer_address,
                'blocks': next((h.blocks for h in found
                                if h.host == lead.host), 0),
                'lead': True}]
        LOG.debug('%s asked who holds %s: %s', host, base_id,
                  ', '.join(h['host'] + (' (lead)' if h.get('lead') else '')
                            for h in out) or 'nobody')
        return out


def holders_server(conf):
    """vmar-agent's RPC server of :class:`HoldersEndpoint`, or None.

    None without a bus (no ``transport_url``): nobody could ask.
    """
    transport = bus.rpc_transport(conf)
    if transport is None:
        return None
    return oslo_messaging.get_rpc_server(
        transport, bus.holders_target(conf, server=socket.gethostname()),
        [HoldersEndpoint(conf)], executor='threading')


def listener(conf, endpoint):
    transport = oslo_messaging.get_notification_transport(conf)
    a = conf.vmar_agent
    targets = [oslo_messaging.Target(topic=t, exchange=a.exchange)
               for t in a.topics]
    # hosts notify on the control exchange, as every service does
    targets.append(oslo_messaging.Target(topic=conf.vmar_reports.report_topic))
    return oslo_messaging.get_notification_listener(
        transport, targets,
        [endpoint, HostReportEndpoint(conf, endpoint.handler)],
        executor='threading', pool=a.pool, allow_requeue=True)


# how long a pass of the pending maps builds them (plus the last map's
# build), outside the library lock: a sixth of the time, one pass every
# PENDING_PERIOD
PENDING_PASS_SECONDS = 1.0
PENDING_PERIOD = 6


def rewrite_pending(conf, handler, limit, seconds=None):
    """Rewrite and publish up to ``limit`` maps left pending.

    ``seconds``: stop after the first map past this long. Returns how many.
    """
    done = handler.library.rewrite_pending(limit, seconds)
    handler.publish_regenerated(done)
    metrics.PENDING_REWRITTEN.inc(len(done))
    if done:
        LOG.info('rewrote %d pending maps', len(done))
    return len(done)


def collect_garbage(conf, handler, dry_run=False, min_age=None):
    """Remove the map versions no host holds (:mod:`.gc`)."""
    return gc.collect(conf, handler.library, handler.publisher,
                      conf.vmar_agent.map_gc_min_age if min_age is None
                      else min_age, dry_run=dry_run)


def run(conf, handler, stop_event, started=None):
    """Listen until ``stop_event`` is set.

    Returns False if the listener did not stop within
    ``[vmar_agent] shutdown_timeout`` (RabbitMQ gone, say): the caller then
    exits anyway, which is safe since messages are acknowledged only after
    they were handled.
    """
    glance_io.remove_stale(conf.vmar.work_dir)
    endpoint = Endpoint(conf, handler)
    # configured, with its library and Glance client: what is left is the
    # transport, which may take long (RabbitMQ away)
    LOG.info('vmar-agent connecting to its notification transport')
    lst = listener(conf, endpoint)
    lst.start()
    rpc = holders_server(conf)
    if rpc is not None:
        rpc.start()
    if started is not None:
        started.set()
    LOG.info('vmar-agent listening (pool %s)', conf.vmar_agent.pool)
    interval = conf.vmar_agent.resync_interval
    gc_interval = conf.vmar_agent.map_gc_interval
    next_sync = time.monotonic() + interval
    next_gc = time.monotonic() + gc_interval
    # pending maps: a minute's worth spread over the minute's passes
    per_pass = -(-conf.vmar_agent.pending_maps_per_minute
                 * PENDING_PERIOD // 60)
    next_pending = time.monotonic()
    while not stop_event.wait(1):
        try:
            if interval and time.monotonic() >= next_sync:
                next_sync = time.monotonic() + interval
                endpoint.succeeded.clear()
                resync(conf, handler, endpoint)
            elif endpoint.succeeded.is_set():
                endpoint.succeeded.clear()
                retry_parked(handler, endpoint)
        except Exception as e:         # Glance or the database away
            LOG.warning('resync failed: %s', e)
        if per_pass and time.monotonic() >= next_pending:
            next_pending = time.monotonic() + PENDING_PERIOD
            try:
                rewrite_pending(conf, handler, per_pass,
                                PENDING_PASS_SECONDS)
            except Exception as e:
                LOG.warning('rewriting pending maps failed: %s', e)
            try:
                # what a writer killed before its compaction left
                handler.library.compact(PENDING_PASS_SECONDS)
            except Exception as e:
                LOG.warning('compacting the fingerprint index failed: %s',
                            e)
        if gc_interval and time.monotonic() >= next_gc:
            next_gc = time.monotonic() + gc_interval
            try:
                collect_garbage(conf, handler)
            except Exception as e:
                LOG.warning('removing old map versions failed: %s', e)

    def _stop():
        for server in (rpc, lst):
            if server is not None:
                server.stop()
                server.wait()
    t = threading.Thread(target=_stop, daemon=True)
    t.start()
    t.join(conf.vmar_agent.shutdown_timeout)
    return not t.is_alive()
