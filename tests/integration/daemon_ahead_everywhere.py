"""pytest plugin: like daemon_everywhere, but every DataLoader built without
``daemon=`` goes through the loaderxd at ``$LOADERX_FORCE_DAEMON`` with
``request_ahead=True``. Used by test_handoff.py to run the embedded loader's
own test suite unchanged against a client that requests ahead."""

from __future__ import annotations

import os

import loaderx.dataloader as _dataloader
from loaderx.client import DaemonOptions

_original_init = _dataloader.DataLoader.__init__


def _init_via_daemon(self, *args, daemon=None, **kwargs):  # type: ignore[no-untyped-def]
    if daemon is None:
        daemon = DaemonOptions(os.environ["LOADERX_FORCE_DAEMON"], request_ahead=True)
    _original_init(self, *args, daemon=daemon, **kwargs)


_dataloader.DataLoader.__init__ = _init_via_daemon  # type: ignore[method-assign]
