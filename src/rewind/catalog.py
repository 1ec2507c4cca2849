"""The Iceberg catalog named in the settings (pyiceberg; SQL on SQLite by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.config import Settings
from rewind.core.store import WarehouseStore, activate
from rewind.errors import ConfigError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def load_catalog(settings: Settings) -> Catalog:
    """Load the configured catalog; any pyiceberg catalog type works (sql, rest, glue, hive)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.catalog import load_catalog as _load

    props = settings.catalog_properties()
    if not settings.catalog.properties:  # the embedded default: its folders may not exist yet
        (settings.state_path / "warehouse").mkdir(parents=True, exist_ok=True)
    # the files Rewind itself reads and writes go through the catalog's FileIO properties
    activate(WarehouseStore.from_catalog_properties(props))
    try:
        return _load(settings.catalog.name, **props)
    except (ValueError, NotImplementedError, ImportError) as exc:
        raise ConfigError(
            f"catalog {settings.catalog.name!r} cannot be loaded: {exc}; check catalog.properties"
        ) from exc
