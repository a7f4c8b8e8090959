"""The cloud's other hosts: reading from them and serving them.

* :mod:`.server`: the peer server ``vmar-export serve`` runs with
  ``[vmar_peers] listen_address`` (nbdkit with :mod:`.nbdkit_peer`): what
  this host holds, for the cloud's other hosts over NBD with TLS;
* :mod:`.source`: the reader of runs from peers, every block checked
  against the image's digest list (nbdkit with :mod:`.nbdkit_peers`, the
  first child of each lazy mirror's fetch quorum);
* :mod:`.digests`: mirrors' digest lists from peers, checked;
* :mod:`.discovery`: which hosts hold an image, from the library;
* :mod:`.nbdkit_proc`: starting an nbdkit and waiting for it.
"""
