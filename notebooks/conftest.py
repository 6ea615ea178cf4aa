"""`pytest --nbmake notebooks/` (the last step of `make test`): kernels on local IPC sockets.

nbmake starts each notebook's kernel on five random TCP ports of 127.0.0.1; two xdist workers
starting kernels at once can pick the same port ("Address already in use"), and the kernel that
lost never answers. Here every nbmake kernel talks over IPC sockets in a folder of its own, as
the papermill batch's kernels do (gemref/walkthrough/batch.py `kernel_config`): nothing to
collide on, nothing listening on the network.
"""
from __future__ import annotations

import shutil
import tempfile

import nbmake.nb_run as nb_run

from gemref.walkthrough.batch import kernel_config


class _IpcNotebookClient(nb_run.NotebookClient):
    """nbmake's client, its kernel on IPC sockets in a temporary folder made for the run."""

    def execute(self, *args, **kwargs):               # what nbmake calls
        sockets = tempfile.mkdtemp(prefix="gemref-nbmake-")
        self.config = kernel_config(sockets)          # read when the run creates its kernel manager
        try:
            return super().execute(*args, **kwargs)
        finally:
            shutil.rmtree(sockets, ignore_errors=True)


nb_run.NotebookClient = _IpcNotebookClient
