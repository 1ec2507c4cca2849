"""The warehouse's file system, the same in the driver and in every Spark task.

The catalog reaches its files through pyiceberg's FileIO, configured by the catalog's
properties (``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``...).
Rewind's own reads and writes of warehouse files (task output, archive files, compaction,
verify's copies) must reach the same files with the same credentials, from processes that
never load the catalog: Spark's Python workers, possibly on other hosts. A
:class:`WarehouseStore` holds those FileIO properties as plain data; task contexts carry it
(it is pickled with them) and build the pyarrow filesystem with pyiceberg's own
``PyArrowFileIO``, so a file URI means the same thing on both sides.

Spark's JVM never opens warehouse files: it cannot read ``s3://`` without hadoop-aws, which
is not available (see :mod:`rewind.spark.parquet_files`).

The store's properties hold secrets: its ``repr`` masks them, and it is never logged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from rewind.secrets import mask

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from pyiceberg.io.pyarrow import PyArrowFileIO

# pyiceberg's FileIO property families (pyiceberg.io): everything else (uri, type, warehouse...)
# is the catalog's business and stays out of the tasks.
_FILEIO_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.", "py-io-impl")
_LOCAL_SCHEMES = ("", "file")


def is_local_uri(uri: str) -> bool:
    """True for a local path or ``file:`` URI (Spark's JVM reads those natively)."""
    return urlparse(uri).scheme in _LOCAL_SCHEMES or (len(uri) > 1 and uri[1] == ":")


@dataclass(frozen=True)
class WarehouseStore:
    """The FileIO properties of the catalog, as plain (picklable, hashable) data."""

    properties: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_catalog_properties(cls, props: Mapping[str, str]) -> WarehouseStore:
        return cls(tuple(sorted((k, str(v)) for k, v in props.items() if k.startswith(_FILEIO_PREFIXES))))

    def __repr__(self) -> str:  # never let a stray repr leak a secret key
        return f"WarehouseStore({mask(dict(self.properties))!r})"

    __str__ = __repr__

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem holding ``uri`` and the path of ``uri`` inside it."""
        # lazy: avoids pyarrow at import
        import pyarrow.fs as pafs

        if is_local_uri(uri):
            return pafs.FileSystem.from_uri(uri) if "://" in uri else (pafs.LocalFileSystem(), uri)
        io = _file_io(self)
        scheme, netloc, path = io.parse_location(uri)
        return io.fs_by_scheme(scheme, netloc), path


@functools.lru_cache(maxsize=8)
def _file_io(store: WarehouseStore) -> PyArrowFileIO:
    """One FileIO per store and process: its filesystems (and their connections) are reused."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(store.properties))


_active = WarehouseStore()


def activate(store: WarehouseStore) -> None:
    """Make ``store`` this process's default (the driver does so when it loads the catalog)."""
    global _active
    _active = store


def active_store() -> WarehouseStore:
    """This process's store: the driver's catalog, or none (local files only) in a task that
    was given no store."""
    return _active


def filesystem(uri: str, store: WarehouseStore | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and inner path of ``uri``, through ``store`` or this process's store."""
    return (store or _active).filesystem(uri)


def make_dirs(uri: str, store: WarehouseStore | None = None) -> None:
    """Create the folder ``uri`` (and its parents) on its filesystem; object stores need none."""
    fs, path = filesystem(uri, store)
    fs.create_dir(path, recursive=True)


def remove_tree(uri: str, store: WarehouseStore | None = None) -> bool:
    """Delete the folder ``uri`` and everything under it; False when there was nothing."""
    # lazy: avoids pyarrow at import
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, store)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return False
    fs.delete_dir(path)
    return True


def remove_files_under(root: str, uris: list[str], store: WarehouseStore | None = None) -> None:
    """Delete each of ``uris`` that lies under the folder ``root`` (a spool's own files, never
    a file it was only given); a file already gone is fine."""
    prefix = root.rstrip("/") + "/"
    for uri in uris:
        if uri.startswith(prefix):
            fs, path = filesystem(uri, store)
            with contextlib.suppress(OSError, FileNotFoundError):
                fs.delete_file(path)


def folder_uri(folder: str | Path) -> str:
    """A folder as a URI: an object-store or ``file:`` URI as given, a path made absolute."""
    text = str(folder)
    if "://" in text:
        return text.rstrip("/")
    return Path(text).expanduser().resolve().as_uri()
