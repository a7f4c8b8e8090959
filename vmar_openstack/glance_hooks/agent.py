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
    of the images that pointed into it, delete its own map images. Old map
    versions of the other images stay in Glance: running instances use
    them.
``image.update``
    A change of owner or visibility changes the dedup scope: the image's
    and the affected images' maps are regenerated and published.

Every ``[vmar_agent] resync_interval`` seconds the agent also compares the
library with Glance's active images (:func:`resync`): Glance's notifier
drops notifications it cannot send, so this catches up on any it missed.

Delivery is at least once: a message is acknowledged only after it was
handled, so a killed agent's work is redelivered. Every handler is
idempotent (a known image is not ingested twice; deleting an unknown image
is a no-op; publishing is idempotent). A failure is retried with
exponential backoff (``retry_delay``, requeued); after ``max_attempts``, or
at once for an image mapgen rejects (``exception.ImageUnusable``), it is
recorded in ``vmar_agent_failures`` and not retried.
"""

import os
import threading
import time

from glanceclient import exc as glance_exc
from oslo_log import log as logging
import oslo_messaging

from vmar_openstack.db import api as db_api
from vmar_openstack.db import failures as db_failures
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack.glance_hooks import publish
from vmar_openstack import ingest
from vmar_openstack.mapsource import glance as gsource

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
        if (payload.get('properties') or {}).get(gsource.PROP_OF):
            return                     # one of our own map images
        if self._known(image_id) is None:
            self._ingest(image_id, payload)
        self.publisher.current(image_id)

    def _ingest(self, image_id, payload):
        local = self._local_store_file(image_id, payload)
        if local:
            self._add(image_id, payload, local, local)
            return
        meta = self.glance.images.get(image_id)
        if meta.get(gsource.PROP_OF):
            return                     # one of our own map images
        if meta['status'] != 'active':
            return
        tmp = gsource.download(self.glance, meta, self.conf.vmar.work_dir,
                               durable=False)
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
            with self.publisher.creating_ahead() as on_map_written:
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
        LOG.info('ingested %s: map v%d, %.1f %% shared', image_id,
                 out.map_version, 100 * out.shared_fraction)
        self._publish_regenerated(out.regenerated)

    def _publish_regenerated(self, regenerated):
        for other in sorted(regenerated):
            self.publisher.current(other)

    def delete(self, payload):
        image_id = payload['id']
        if self._known(image_id) is not None:
            try:
                out = self.library.delete(image_id)
            except exception.ImageNotFound:
                out = None
            if out is not None:
                self._publish_regenerated(out.regenerated)
        self.publisher.delete_all(image_id)

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
        self._publish_regenerated(dict(out.regenerated,
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
    counted and recorded as for notifications).
    """
    glance = handler.glance
    seen = set()
    for img in glance.images.list(filters={'status': 'active'}):
        if img.get(gsource.PROP_OF):
            continue
        seen.add(img['id'])
        if handler._known(img['id']) is None:
            LOG.info('resync: %s is not in the library', img['id'])
            endpoint.info({}, 'vmar-agent', 'image.activate', dict(img), {})
    with db_session.reader(conf) as s:
        known = {i.image_id for i in db_api.list_images(s)}
    for image_id in sorted(known - seen):
        try:
            glance.images.get(image_id)
            continue                   # not active (yet), or hidden
        except glance_exc.HTTPNotFound:
            pass
        LOG.info('resync: %s is gone from Glance', image_id)
        endpoint.info({}, 'vmar-agent', 'image.delete', {'id': image_id}, {})


class Endpoint:
    """The oslo.messaging notification endpoint."""

    filter_rule = oslo_messaging.NotificationFilter(
        event_type=r'^image\.(activate|upload|delete|update)$')

    def __init__(self, conf, handler):
        self.conf = conf
        self.handler = handler
        self.failures = db_failures.Failures(conf)

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        image_id = payload.get('id') if isinstance(payload, dict) else None
        if not image_id:
            return oslo_messaging.NotificationResult.HANDLED
        prior = self.failures.get(image_id)
        if prior and prior[1] and event_type != 'image.delete':
            LOG.info('%s for %s skipped: recorded as failed', event_type,
                     image_id)
            return oslo_messaging.NotificationResult.HANDLED
        LOG.debug('%s for %s', event_type, image_id)
        try:
            self.handler.dispatch(event_type, payload)
        except Exception as e:
            permanent = isinstance(e, exception.ImageUnusable)
            attempts, gave_up = self.failures.record(
                image_id, event_type, '%s: %s' % (type(e).__name__, e),
                permanent)
            if gave_up:
                LOG.error('%s for %s failed for good after %d attempts: %s',
                          event_type, image_id, attempts, e)
                return oslo_messaging.NotificationResult.HANDLED
            delay = self.conf.vmar_agent.retry_delay * 2 ** (attempts - 1)
            LOG.warning('%s for %s failed (attempt %d), retrying in %.1fs: '
                        '%s', event_type, image_id, attempts, delay, e)
            time.sleep(delay)
            return oslo_messaging.NotificationResult.REQUEUE
        if prior:
            self.failures.clear(image_id)
        return oslo_messaging.NotificationResult.HANDLED


def listener(conf, handler):
    transport = oslo_messaging.get_notification_transport(conf)
    a = conf.vmar_agent
    targets = [oslo_messaging.Target(topic=t, exchange=a.exchange)
               for t in a.topics]
    return oslo_messaging.get_notification_listener(
        transport, targets, [Endpoint(conf, handler)], executor='threading',
        pool=a.pool, allow_requeue=True)


def run(conf, handler, stop_event, started=None):
    """Listen until ``stop_event`` is set.

    Returns False if the listener did not stop within
    ``[vmar_agent] shutdown_timeout`` (RabbitMQ gone, say): the caller then
    exits anyway, which is safe since messages are acknowledged only after
    they were handled.
    """
    gsource.remove_stale(conf.vmar.work_dir)
    lst = listener(conf, handler)
    lst.start()
    if started is not None:
        started.set()
    LOG.info('vmar-agent listening (pool %s)', conf.vmar_agent.pool)
    interval = conf.vmar_agent.resync_interval
    endpoint = Endpoint(conf, handler)
    next_sync = time.monotonic() + interval
    while not stop_event.wait(1):
        if interval and time.monotonic() >= next_sync:
            try:
                resync(conf, handler, endpoint)
            except Exception as e:     # Glance or the database away
                LOG.warning('resync failed: %s', e)
            next_sync = time.monotonic() + interval

    def _stop():
        lst.stop()
        lst.wait()
    t = threading.Thread(target=_stop, daemon=True)
    t.start()
    t.join(conf.vmar_agent.shutdown_timeout)
    return not t.is_alive()
