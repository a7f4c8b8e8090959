"""Where the library keeps its files on this host."""

import os

from vmar_openstack import names


def map_path(conf, image_id, version):
    """The map file of one map version of an image."""
    return os.path.join(conf.vmar.map_dir, names.map_file(image_id, version))


def base_path(conf, image_id):
    """The raw base file of an image."""
    return os.path.join(conf.vmar.base_dir, image_id)


def digests_path(conf, image_id):
    """The digest list of an image's base (mirror-format.rst)."""
    return os.path.join(conf.vmar.digest_dir, names.digest_file(image_id))


def bootset_path(conf, image_id):
    """The boot working set of an image, next to its digest list."""
    return os.path.join(conf.vmar.digest_dir, names.bootset_file(image_id))


def layout_path(conf, image_id):
    """The block layout of an image, next to its digest list."""
    return os.path.join(conf.vmar.digest_dir, names.layout_file(image_id))
