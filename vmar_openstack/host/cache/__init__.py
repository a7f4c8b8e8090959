"""The host page cache: what the host keeps of its bases, and how.

* :mod:`.prefetch`: boot working sets read ahead, and fills of mirrors;
* :mod:`.warm`: the metadata of the bases kept warm, by their block
  layouts;
* :mod:`.pinned`: pages locked in memory (``mlock``) for :mod:`.warm`;
* :mod:`.pagecache`: residency (``mincore``), eviction and read-ahead.
"""
