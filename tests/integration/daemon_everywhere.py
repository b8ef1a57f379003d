"""pytest plugin: every DataLoader built without ``daemon=`` goes through the
loaderxd at ``$LOADERX_FORCE_DAEMON``. Used to run the embedded loader's own
test suite unchanged against the daemon (test_embedded_suite_via_daemon.py)."""

from __future__ import annotations

import os

import loaderx.dataloader as _dataloader

_original_init = _dataloader.DataLoader.__init__


def _init_via_daemon(self, *args, daemon=None, **kwargs):  # type: ignore[no-untyped-def]
    if daemon is None:
        daemon = os.environ["LOADERX_FORCE_DAEMON"]
    _original_init(self, *args, daemon=daemon, **kwargs)


_dataloader.DataLoader.__init__ = _init_via_daemon  # type: ignore[method-assign]
