"""The data directory's permissions: private to the user SparkOps runs as.

The data directory (``SPARKOPS_DATA_DIR``) holds the SQLite database (session keys, password
hashes, webhook secrets, containers' environments), the secret key, the first admin's password
and the file broker's messages. Any other local user who can read one of them can take over a
session, so the directory is 0700 and every file in it 0600:

* new files and folders are private from the moment they exist: every SparkOps process sets the
  umask ``PRIVATE_UMASK`` as its settings load (``bin/sparkops`` sets it too, for what it runs
  before Python), and secrets are created with ``create_private_file`` (``O_EXCL``, mode 0600:
  never written first and restricted second);
* an installation from before this rule is tightened on start by ``tighten``: group and other
  bits are removed from the directory and everything below it. Symbolic links are neither
  followed nor changed, so nothing outside the directory is touched.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

# Files 0600, folders 0700, whatever mode their creator asks for.
PRIVATE_UMASK = 0o077
# The bits no one but the owner may have.
_SHARED_BITS = stat.S_IRWXG | stat.S_IRWXO


def create_private_file(path: Path, text: str) -> bool:
    """Write ``text`` to a new file at ``path``, mode 0600 from its creation, complete or absent.

    The text is written to a private temporary file beside ``path`` (``O_EXCL``, mode 0600),
    which is then hard-linked into place: a reader never finds ``path`` empty or half-written.
    Returns False, writing nothing, when ``path`` exists already (another process created it
    first: its content wins). Cost: one small file written, one link, one unlink.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        temporary.unlink()


def tighten(root: Path) -> list[Path]:
    """Remove group and other permission bits from ``root`` and everything below it.

    Returns the paths that were changed (empty when all was private already). Symbolic links
    are skipped, never followed; entries that vanish meanwhile (broker messages taken by a
    worker) are ignored. Cost: one ``lstat`` per entry, a ``chmod`` only where one is needed.
    """
    changed: list[Path] = []
    if _restrict(root):
        changed.append(root)
    for folder, subfolders, files in os.walk(root, followlinks=False):
        for name in subfolders + files:
            path = Path(folder) / name
            if _restrict(path):
                changed.append(path)
    return changed


def _restrict(path: Path) -> bool:
    """Remove the shared bits of one file or folder; True when its mode changed."""
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode) or not mode & _SHARED_BITS:
            return False
        os.chmod(path, stat.S_IMODE(mode) & ~_SHARED_BITS)
    except FileNotFoundError:
        return False
    return True
