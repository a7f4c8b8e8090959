"""The host's exports: what is exported, its files and the daemon's graph.

* :mod:`.state`: the exports of the host (``exports.json``) and the
  :class:`~.state.Export` record;
* :mod:`.hostdir`: the maps, base files and mirrors under ``host_dir``;
* :mod:`.graph`: the daemon's block nodes and exports, and their names;
* :mod:`.qmp`: the QMP client of the daemon;
* :mod:`.locks`: the in-process locks of the host's files.
"""
