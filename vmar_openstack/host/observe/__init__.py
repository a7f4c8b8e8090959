"""What the daemon says of itself.

* :mod:`.status`: ``vmar-export status``, the whole host in one view;
* :mod:`.metrics`: the Prometheus collector of the daemon;
* :mod:`.report`: the host's reports to the library (what it holds, for
  the scheduler's weigher and for peers).
"""
