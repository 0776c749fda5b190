# -*- coding: utf-8 -*-
"""The node code as one self-contained archive, for the srun engine: what each step's tasks run on the nodes.

A Python zip application: ``module_utils/preflight_node`` (the node layer, the same files the Ansible modules ship)
as the package ``preflight_node``, and a ``__main__`` that runs ``preflight_node.srun_task``.  It needs nothing on
a node but a Python 3 (``preflight_srun_python``): never the controller's venv.  The bytes depend only on the
files (sorted, fixed times), so its name carries its digest and a node holds one file per version of the code.

The srun engine sends it to every node of the allocation with ``sbcast`` into ``preflight_srun_dir`` (root's
alone); a site that keeps it on a shared filesystem writes it once (``python -m cluster_preflight.engine.archive
PATH``) and names it in ``preflight_srun_archive``.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import zipfile

import preflight_node

NODE_DIR = os.path.dirname(os.path.abspath(preflight_node.__file__))
PREFIX = "cluster-preflight-node-"
MAIN = "import sys\nfrom preflight_node.srun_task import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def node_files():
    """The node layer's source files, relative to it, sorted: its subpackages too (``preflight_node.host``, ...)."""
    found = []
    for folder, dirs, files in os.walk(NODE_DIR):
        dirs[:] = [name for name in dirs if not name.startswith((".", "__pycache__"))]
        relative = os.path.relpath(folder, NODE_DIR)
        found += [name if relative == "." else "%s/%s" % (relative.replace(os.sep, "/"), name)
                  for name in files if name.endswith(".py")]
    return sorted(found)


def build():
    """``(bytes, sha256 hex)`` of the archive of the node code as it is in this checkout."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        entries = [("__main__.py", MAIN.encode("utf-8"))]
        for name in node_files():
            with open(os.path.join(NODE_DIR, name), "rb") as handle:
                entries.append(("preflight_node/%s" % name, handle.read()))
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def file_name(digest):
    """The archive's name on the nodes: its digest in it, so two versions never share a file."""
    return "%s%s.pyz" % (PREFIX, digest[:16])


def write(path):
    """Write the archive to ``path`` (0644, atomically); its digest."""
    data, digest = build()
    temp = "%s.%d.tmp" % (path, os.getpid())
    with open(temp, "wb") as handle:
        handle.write(data)
    os.chmod(temp, 0o644)
    os.replace(temp, path)
    return digest


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m cluster_preflight.engine.archive PATH (the node code for preflight_srun_archive)",
              file=sys.stderr)
        return 4
    digest = write(argv[0])
    print("%s: the node code, sha256 %s; name it in preflight_srun_archive (root's alone on every node)" % (
        argv[0], digest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
