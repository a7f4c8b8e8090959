"""Publishing map versions to Glance as hidden images (the layout is the
contract's, :mod:`vmar_openstack.names`).

Idempotent: a map version has one deterministic image id, so publishing it
twice, or from two agents at once, leaves one active image. A version whose
map file is missing on this host (another host's plugin wrote it) is
replaced by a new version written from the tables.

The map image of a new version can be created while the library commits
(:meth:`Publisher.precreate`), so that only the upload is left once the
version is committed. If the version then fails to commit, the empty
record is deleted; a record left by a process killed at that moment is
queued and hidden, never listed as a map, and a later attempt that finds it
with other content publishes a new version instead.
"""

import concurrent.futures
import contextlib
import hashlib
import io
import os
import socket
import threading
import time
import uuid

from glanceclient import exc as glance_exc
from oslo_log import log as logging

from vmar_openstack.db import api as db_api
from vmar_openstack.db import publications as db_publications
from vmar_openstack.db import session as db_session
from vmar_openstack import exception
from vmar_openstack import ingest
from vmar_openstack import names

LOG = logging.getLogger(__name__)


class Publisher:

    def __init__(self, conf, glance, library=None):
        self.conf = conf
        self.glance = glance
        self.library = library or ingest.Library(conf)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix='vmar-precreate')
        self._created = {}              # map image id -> Future of create
        self._created_lock = threading.Lock()
        self.publications = db_publications.Publications(
            conf, '%s:%d:%s' % (socket.gethostname(), os.getpid(),
                                uuid.uuid4().hex[:8]))

    @contextlib.contextmanager
    def _claimed(self, object_id, image_id, what, sha):
        """Hold the claim of one hidden image while the block uploads it.

        Waits while another publisher holds it, up to ``[vmar_agent]
        publish_claim_timeout``, then takes it over. Recorded done if the
        block succeeds, released if it fails.
        """
        timeout = self.conf.vmar_agent.publish_claim_timeout
        deadline = time.monotonic() + timeout
        pause = 0.05
        while self.publications.claim(object_id, image_id, what, sha,
                                      timeout) != db_publications.TAKEN:
            if time.monotonic() > deadline:
                # the holder's claim has aged past the timeout by now
                timeout = 0
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        try:
            yield
        except BaseException:
            self.publications.release(object_id)
            raise
        self.publications.done(object_id, sha)

    @contextlib.contextmanager
    def creating_ahead(self):
        """Yield an ``on_map_written`` callback for ``Library.add``.

        Each map version written gets its map image created while the
        library commits (:meth:`precreate`); if the block raises, those
        records are deleted again (:meth:`discard`).
        """
        made = []

        def on_map_written(image_id, version, _path, sha):
            self.precreate(image_id, version, sha)
            made.append((image_id, version))
        try:
            yield on_map_written
        except BaseException:
            for image_id, version in made:
                self.discard(image_id, version)
            raise

    def precreate(self, image_id, version, sha):
        """Start creating the map image of a version not yet committed.

        :meth:`publish` then uses the record; :meth:`discard` removes it if
        the version does not commit.
        """
        mid = names.map_image_id(image_id, version)
        fut = self._pool.submit(self._get_or_create, mid, image_id, version,
                                sha)
        with self._created_lock:
            self._created[mid] = fut

    def discard(self, image_id, version):
        """Delete the record :meth:`precreate` made for ``version``."""
        mid = names.map_image_id(image_id, version)
        with self._created_lock:
            fut = self._created.pop(mid, None)
        if fut is None:
            return
        try:
            img = fut.result()
            if img['status'] == 'queued':
                self.glance.images.delete(mid)
        except Exception as e:          # best effort: it is hidden and empty
            LOG.warning('could not delete the unused map image %s: %s',
                        mid, e)

    def _created_record(self, mid, image_id, version, sha):
        with self._created_lock:
            fut = self._created.pop(mid, None)
        if fut is not None:
            try:
                return fut.result()
            except Exception as e:      # any failure: try once more, here
                LOG.debug('creating %s ahead failed (%s); again', mid, e)
        return self._get_or_create(mid, image_id, version, sha)

    def current(self, image_id):
        """Publish the image's current map version; returns the version.

        None: the image is not in the library, or left it meanwhile (a
        pass of the pending maps publishes beside the image's delete).
        """
        with db_session.reader(self.conf) as s:
            img = db_api.get_image(s, image_id)
            if img is None:
                return None
            version = img.map_version
        path = ingest.map_path(self.conf, image_id, version)
        if not os.path.exists(path):
            LOG.warning('map v%d of %s is not on this host; writing a new '
                        'version', version, image_id)
            version = self.library.remap(image_id)
            path = ingest.map_path(self.conf, image_id, version)
        try:
            self.publish(image_id, version, path)
        except exception.StuckError as e:
            # a dead uploader can leave a map image in 'saving' for good,
            # and a deleted image id cannot be reused: use a new version
            LOG.warning('%s; publishing a new version', e)
            version = self.library.remap(image_id)
            self.publish(image_id, version,
                         ingest.map_path(self.conf, image_id, version))
        if not self.library.has_image(image_id):
            # deleted while this published: the delete listed the image's
            # maps (delete_all) before this one was there, or after
            self.delete_version(image_id, version)
            LOG.info('map v%d of %s withdrawn: the image was deleted while '
                     'it was published', version, image_id)
            return None
        return version

    def publish(self, image_id, version, path):
        with open(path, 'rb') as f:
            data = f.read()
        sha = hashlib.sha256(data).hexdigest()
        mid = names.map_image_id(image_id, version)
        try:
            # one publisher at a time, across agents: two uploads of one
            # image at once leave it in 'saving'
            with self._claimed(mid, image_id, 'map', sha):
                img = self._created_record(mid, image_id, version, sha)
                if (img['status'] == 'queued'
                        and img.get(names.PROP_SHA256) != sha):
                    # left by an attempt whose version never committed
                    raise exception.StuckError(
                        'map image %s was created for other content' % mid)
                self._upload(img, data, sha, names.PROP_SHA256, 'map image')
        except glance_exc.ClientException as e:
            raise exception.PublishError(
                'publishing map v%d of %s: %s' % (version, image_id, e))
        LOG.info('published map v%d of %s as Glance image %s', version,
                 image_id, mid)
        return mid

    def _upload(self, img, data, sha, sha_prop, what):
        """Upload ``data`` into the record ``img`` unless it has it.

        Waits out another agent's upload; checks the result's status and
        its ``sha_prop`` against ``sha``.
        """
        mid = img['id']
        deadline = time.monotonic() + 60
        while True:
            while img['status'] in ('saving', 'importing'):
                if time.monotonic() > deadline:
                    raise exception.StuckError(
                        '%s %s stuck in %s' % (what, mid, img['status']))
                time.sleep(0.5)
                img = self.glance.images.get(mid)
            if img['status'] != 'queued':
                break
            try:
                self.glance.images.upload(mid, io.BytesIO(data),
                                          image_size=len(data))
            except glance_exc.HTTPConflict:
                # another agent's upload started first (agents on two
                # Galera nodes both hold the library lock): wait it out
                img = self.glance.images.get(mid)
            else:
                # Glance answers the PUT once the image is active
                img = dict(img, status='active')
                break
        if img['status'] != 'active':
            raise exception.PublishError(
                '%s %s is %s' % (what, mid, img['status']))
        if img.get(sha_prop) != sha:
            raise exception.PublishError(
                '%s %s has SHA-256 %s, the data %s'
                % (what, mid, img.get(sha_prop), sha))

    def files(self, image_id):
        """Publish what hosts read beside an image's maps, once each."""
        self.digests(image_id)
        self.bootset(image_id)
        self.layout(image_id)

    def digests(self, image_id):
        """Publish the digest list of an image's base, once.

        Hosts with ``[vmar_host] base_fetch = lazy`` check the blocks they
        fetch against it. Returns its id, or None when the library has no
        SHA-256 digests.
        """
        return self._publish_file(
            image_id, names.digests_image_id(image_id),
            names.digests_image_name(image_id),
            self.library.digest_list, names.PROP_DIGESTS_SHA256,
            'digest list')

    def bootset(self, image_id):
        """Publish the boot working set of an image, once.

        Hosts prefetch it when they add an image's first export. Returns
        its id, or None when the library has none for the image.
        """
        return self._publish_file(
            image_id, names.bootset_image_id(image_id),
            names.bootset_image_name(image_id),
            self.library.bootset, names.PROP_BOOTSET_SHA256,
            'boot working set')

    def layout(self, image_id):
        """Publish the block layout of an image, once.

        Hosts keep the metadata blocks it names warm. Returns its id, or
        None when the library has none for the image.
        """
        return self._publish_file(
            image_id, names.layout_image_id(image_id),
            names.layout_image_name(image_id),
            self.library.layout, names.PROP_LAYOUT_SHA256, 'block layout')

    def recorded_bootset(self, image_id, data):
        """Publish the boot working set a host recorded, once.

        ``data`` is the set's file, checked by the caller. The first one
        published stays: later boots read the same blocks.
        """
        return self._publish_file(
            image_id, names.bootset_image_id(image_id, 'recorded'),
            names.bootset_image_name(image_id, 'recorded'),
            lambda _image_id: data, names.PROP_BOOTSET_SHA256,
            'recorded boot working set')

    def _publish_file(self, image_id, did, name, read, sha_prop, what):
        """Publish ``read(image_id)`` as the hidden image ``did``, once.

        An image's data never changes, so an active image of ours is left
        as it is.
        """
        try:
            try:
                img = self.glance.images.get(did)
            except glance_exc.HTTPNotFound:
                img = None
            if img and img['status'] == 'active':
                return did
            data = read(image_id)
            if data is None:
                return None
            sha = hashlib.sha256(data).hexdigest()
            # one publisher at a time, across agents (see publish)
            with self._claimed(did, image_id, what, sha):
                if img is None:
                    try:
                        img = self.glance.images.create(
                            id=did, name=name,
                            disk_format='raw', container_format='bare',
                            visibility='private', os_hidden=True,
                            **{names.PROP_OF: image_id, sha_prop: sha})
                    except glance_exc.HTTPConflict:
                        img = self.glance.images.get(did)
                self._upload(img, data, sha, sha_prop, what + ' image')
        except glance_exc.ClientException as e:
            raise exception.PublishError(
                'publishing the %s of %s: %s' % (what, image_id, e))
        LOG.info('published the %s of %s as Glance image %s', what,
                 image_id, did)
        return did

    def _get_or_create(self, mid, image_id, version, sha):
        props = {names.PROP_OF: image_id,
                 names.PROP_VERSION: str(version),
                 names.PROP_SHA256: sha}
        try:
            return self.glance.images.create(
                id=mid, name=names.map_image_name(image_id, version),
                disk_format='raw', container_format='bare',
                visibility='private', os_hidden=True, **props)
        except glance_exc.HTTPConflict:
            return self.glance.images.get(mid)

    def _delete(self, iid, what):
        """Delete one hidden image of ours (gone already: fine)."""
        try:
            self.glance.images.delete(iid)
        except glance_exc.HTTPNotFound:
            pass
        except glance_exc.ClientException as e:
            raise exception.PublishError('deleting %s image %s: %s'
                                         % (what, iid, e))
        self.publications.forget([iid])

    def delete_version(self, image_id, version):
        """Delete the map image of one version (gone already: fine)."""
        self._delete(names.map_image_id(image_id, version), 'map')

    def delete_all(self, image_id, keep=()):
        """Delete the published map versions of a deleted image.

        Versions in ``keep`` stay (hosts export them: a server moving to
        another host fetches its map there); :mod:`.gc` deletes them once
        no host does. Its digest list stays: hosts read the blocks the old
        versions of other maps use from the images that hold them, and
        check them against it; :mod:`.gc` deletes it with the last such
        version. Returns how many map images went.
        """
        spare = {names.digests_image_id(image_id)} | {
            names.map_image_id(image_id, v) for v in keep}
        try:
            found = list(self.glance.images.list(filters={
                names.PROP_OF: image_id, 'os_hidden': True}))
        except glance_exc.ClientException as e:
            raise exception.PublishError(
                'listing the maps of %s: %s' % (image_id, e))
        doomed = [img for img in found if img.get(names.PROP_OF) == image_id
                  and img['id'] not in spare]
        for img in doomed:
            self._delete(img['id'], 'map')
        if keep:
            LOG.info('kept map v%s of the deleted image %s: hosts export '
                     'them', ', v'.join(str(v) for v in sorted(keep)),
                     image_id)
        return len(doomed)

    def hidden_images(self):
        """Every hidden image of Glance: maps, digest lists, sets, layouts.

        One listing for the map GC pass's questions
        (:meth:`maps_of_deleted`, :meth:`digest_lists`).
        """
        try:
            return list(self.glance.images.list(filters={'os_hidden': True}))
        except glance_exc.ClientException as e:
            raise exception.PublishError('listing hidden images: %s' % e)

    def maps_of_deleted(self, has_image, found=None):
        """``{(image id, version): Glance id}`` of maps of deleted images.

        The published map versions whose image ``has_image(image_id)``
        says is no longer in the library: those :meth:`delete_all` kept.
        ``found``: :meth:`hidden_images`, if listed already.
        """
        out = {}
        for img in self.hidden_images() if found is None else found:
            of, version = img.get(names.PROP_OF), img.get(names.PROP_VERSION)
            if not of or version is None or not str(version).isdigit():
                continue
            if img['id'] != names.map_image_id(of, int(version)):
                continue
            if not has_image(of):
                out[(of, int(version))] = img['id']
        return out

    def digest_lists(self, found=None):
        """base image id -> id of its published digest list image.

        ``found``: :meth:`hidden_images`, if listed already.
        """
        return {img[names.PROP_OF]: img['id']
                for img in (self.hidden_images() if found is None
                            else found)
                if img.get(names.PROP_DIGESTS_SHA256)
                and img.get(names.PROP_OF)
                and img['id'] == names.digests_image_id(
                    img[names.PROP_OF])}

    def delete_digests(self, image_id):
        """Delete the digest list image of a base (gone already: fine)."""
        self._delete(names.digests_image_id(image_id), 'digest list')
