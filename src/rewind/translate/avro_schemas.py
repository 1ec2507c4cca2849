"""Where Avro writer schemas come from: a folder of ``.avsc`` files or a schema registry."""

from __future__ import annotations

import json
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rewind.secrets import mask_url
from rewind.translate.exceptions import SchemaRegistryUnavailable, SchemaSourceError

log = logging.getLogger(__name__)


class SchemaSource(ABC):
    """Where Avro schemas come from: writer schemas by id, and the reader ("latest") schema.

    Schemas are returned as parsed JSON (dict, list or str), not yet given to fastavro.
    Implementations do no I/O in ``__init__`` and are picklable, so a decoder built on the
    driver can be shipped to Spark tasks.
    """

    @abstractmethod
    def writer_schema(self, schema_id: int) -> Any | None:
        """The schema registered under ``schema_id``, or None if there is no such id.

        Raises :class:`SchemaSourceError` when the source itself cannot be read.
        """

    @abstractmethod
    def reader_schema(self) -> Any:
        """The schema every record is evolved to."""

    @abstractmethod
    def describe(self) -> str:
        """Where the schemas come from, for messages."""


@dataclass(frozen=True)
class WriterSchema:
    """The schema records are written with, and the id that goes into their 5-byte header."""

    schema_id: int
    schema: Any
    where: str
    """Where it came from, for messages: ``3.avsc in schemas/``, ``subject orders-value version 2 ...``."""


def canonical_form(schema: Any) -> str:
    """Avro's parsing canonical form: two schemas are the same schema when these are equal."""
    # lazy: avoids fastavro at import
    import fastavro
    from fastavro.schema import to_parsing_canonical_form

    return str(to_parsing_canonical_form(fastavro.parse_schema(schema, _force=True)))


def _load_avsc(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchemaSourceError(
            f"Avro schema file {path}: cannot read it ({e}); fix or remove the file"
        ) from e


class LocalSchemaSource(SchemaSource):
    """A folder of ``<id>.avsc`` files; the reader schema is ``latest.avsc`` or an explicit file."""

    def __init__(
        self, folder: str | os.PathLike[str], reader_schema_path: str | os.PathLike[str] | None = None
    ):
        self.folder = Path(folder)
        self.reader_schema_path = Path(reader_schema_path) if reader_schema_path is not None else None
        self._cache: dict[int, Any | None] = {}

    def describe(self) -> str:
        return f"schema folder {self.folder}"

    def _check_folder(self) -> None:
        if not self.folder.is_dir():
            raise SchemaSourceError(
                f"Avro schema folder {self.folder} does not exist; check decode.schema_dir"
            )

    def writer_schema(self, schema_id: int) -> Any | None:
        if schema_id not in self._cache:
            self._check_folder()
            path = self.folder / f"{schema_id}.avsc"
            self._cache[schema_id] = _load_avsc(path) if path.is_file() else None
        return self._cache[schema_id]

    def reader_schema(self) -> Any:
        path = self.reader_schema_path
        if path is None:
            self._check_folder()
            path = self.folder / "latest.avsc"
            if not path.is_file():
                raise SchemaSourceError(
                    f"no reader schema: put latest.avsc in {self.folder} or set decode.reader_schema"
                )
        elif not path.is_file():
            raise SchemaSourceError(
                f"Avro reader schema {path} does not exist; check decode.reader_schema"
            )
        return _load_avsc(path)

    def latest_writer(self) -> WriterSchema:
        """The schema a sink writes with: the highest ``<id>.avsc`` of the folder, under that id.

        The folder is one subject's history as the decoder reads it (``<id>.avsc`` by schema
        id, ``latest.avsc`` the reader schema), so ``latest.avsc``, when present, must be that
        same schema: a writer and its readers then agree on what "latest" is.
        """
        self._check_folder()
        ids = sorted(int(p.stem) for p in self.folder.glob("*.avsc") if p.stem.isdigit())
        if not ids:
            raise SchemaSourceError(
                f"Avro schema folder {self.folder} has no <id>.avsc file; name each version by its "
                "schema id (1.avsc, 2.avsc...)"
            )
        top = ids[-1]
        schema = _load_avsc(self.folder / f"{top}.avsc")
        latest = self.folder / "latest.avsc"
        if latest.is_file() and _same_text(latest, schema) is False:
            raise SchemaSourceError(
                f"{latest} is not the same schema as {top}.avsc, the highest id; readers evolve to "
                f"latest.avsc and the sink writes with {top}.avsc: make them one schema"
            )
        return WriterSchema(top, schema, f"{top}.avsc in {self.folder}")


def _same_text(path: Path, schema: Any) -> bool:
    try:
        return canonical_form(_load_avsc(path)) == canonical_form(schema)
    except SchemaSourceError:
        raise
    except Exception as e:  # fastavro's parse errors
        raise SchemaSourceError(f"Avro schema file {path} is not a valid schema: {e}") from e


# One registry client per process and configuration: Spark workers fork, so a client made in a
# parent is never reused in a child (the pid is part of the key).
_REGISTRY_CLIENTS: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any] = {}
_REGISTRY_LOCK = threading.Lock()


def _registry_client(url: str, config: Mapping[str, Any]) -> Any:
    key = (os.getpid(), url, tuple(sorted((k, str(v)) for k, v in config.items())))
    with _REGISTRY_LOCK:
        client = _REGISTRY_CLIENTS.get(key)
        if client is None:
            try:
                # lazy: avoids confluent_kafka at import; the registry's dependencies may be missing
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as e:
                raise SchemaSourceError(
                    f"the schema registry client cannot be imported ({e}); install confluent-kafka's "
                    "registry dependencies: pip install attrs authlib httpx2 cachetools certifi"
                ) from e
            # new_client: an in-process registry for mock:// URLs (tests), a REST client otherwise
            client = SchemaRegistryClient.new_client({**config, "url": url})
            _REGISTRY_CLIENTS[key] = client
        return client


class RegistrySchemaSource(SchemaSource):
    """A Confluent-compatible schema registry (confluent-kafka's ``SchemaRegistryClient``).

    Writer schemas are fetched by id; the reader schema is ``subject``'s latest version (or
    ``reader_version``). "Not found" for an id makes its records quarantined; any other failure
    (refused connection, timeout, 5xx, bad credentials) raises :class:`SchemaRegistryUnavailable`,
    failing the task rather than quarantining good records.
    """

    def __init__(
        self,
        url: str,
        subject: str | None = None,
        config: Mapping[str, Any] | None = None,
        reader_version: int | Literal["latest"] = "latest",
        field: str = "decode.registry_url",
    ) -> None:
        self.url = url
        self.subject = subject
        self.config = dict(config or {})
        self.reader_version = reader_version
        self.field = field  # the spec field that named the registry, for messages
        self._cache: dict[int, Any | None] = {}

    def describe(self) -> str:
        return f"schema registry {mask_url(self.url)}"

    def _client(self) -> Any:
        return _registry_client(self.url, self.config)

    def writer_schema(self, schema_id: int) -> Any | None:
        if schema_id in self._cache:
            return self._cache[schema_id]
        from_registry = self._call(
            lambda: self._client().get_schema(schema_id), f"cannot fetch schema id {schema_id}"
        )
        if from_registry is None:
            self._cache[schema_id] = None
            return None
        schema_type = (from_registry.schema_type or "AVRO").upper()
        if schema_type != "AVRO":
            log.warning("schema id %d in %s is a %s schema, not Avro", schema_id, self.url, schema_type)
            self._cache[schema_id] = None
            return None
        if from_registry.references:
            raise SchemaSourceError(
                f"schema id {schema_id} in {self.url} uses schema references, which Rewind does not resolve; "
                "use a self-contained schema or a local schema folder"
            )
        schema = json.loads(from_registry.schema_str)
        self._cache[schema_id] = schema
        return schema

    def reader_schema(self) -> Any:
        if self.subject is None:
            raise SchemaSourceError(
                "no reader schema: set decode.subject (its latest version is the reader schema) "
                "or decode.reader_schema"
            )
        subject = self.subject
        version = self.reader_version
        what = f"cannot fetch the {version} version of subject {subject}"
        if version == "latest":
            registered = self._call(lambda: self._client().get_latest_version(subject), what)
        else:
            registered = self._call(lambda: self._client().get_version(subject, version), what)
        if registered is None:
            raise SchemaSourceError(
                f"schema registry at {self.url}: subject {subject} not found; check decode.subject"
            )
        return json.loads(registered.schema.schema_str)

    def latest_writer(self, subject: str) -> WriterSchema | None:
        """The subject's latest version and its id; None when the subject has no version.

        Asks for the list of versions first: the client caches ``latest`` for its lifetime,
        which would hide a version registered since (a version itself never changes).
        """
        versions = self._call(
            lambda: self._client().get_versions(subject), f"cannot list the versions of subject {subject}"
        )
        if not versions:
            return None
        version = max(versions)
        registered = self._call(
            lambda: self._client().get_version(subject, version),
            f"cannot fetch version {version} of subject {subject}",
        )
        if registered is None:
            return None
        return self._writer_of(registered, subject)

    def register(self, subject: str, schema: Any) -> WriterSchema:
        """Register ``schema`` under ``subject`` (a no-op when it is there) and return its id.

        The registry decides whether the schema is compatible with the subject's versions; a
        refusal is one line with the registry's reason.
        """
        # lazy: avoids confluent_kafka at import
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = json.dumps(schema, separators=(",", ":"))
        try:
            schema_id = self._client().register_schema(subject, Schema(text, "AVRO"))
        except SchemaRegistryError as e:
            if e.http_status_code in (409, 422):
                raise SchemaSourceError(
                    f"{self.describe()} refused the schema for subject {subject} "
                    f"(HTTP {e.http_status_code}: {e.error_message}); make the schema compatible "
                    "with the subject's versions or choose another sink.kafka.subject"
                ) from e
            raise SchemaRegistryUnavailable(
                mask_url(self.url),
                f"cannot register a schema under subject {subject} (HTTP {e.http_status_code}: "
                f"{e.error_message})",
                field=self.field,
            ) from e
        except Exception as e:  # transport errors of the HTTP client
            raise SchemaRegistryUnavailable(
                mask_url(self.url),
                f"cannot register a schema under subject {subject} ({type(e).__name__}: {e})",
                field=self.field,
            ) from e
        found = self.latest_writer(subject)
        if found is not None and found.schema_id == schema_id:
            return found
        where = f"schema id {schema_id} of subject {subject} in {self.describe()}"
        return WriterSchema(int(schema_id), schema, where)

    def _writer_of(self, registered: Any, subject: str) -> WriterSchema:
        schema_type = (registered.schema.schema_type or "AVRO").upper()
        where = (
            f"subject {subject} version {registered.version} (schema id {registered.schema_id}) "
            f"in {self.describe()}"
        )
        if schema_type != "AVRO":
            raise SchemaSourceError(f"{where} is a {schema_type} schema, not Avro; choose an Avro subject")
        if registered.schema.references:
            raise SchemaSourceError(
                f"{where} uses schema references, which Rewind does not resolve; use a self-contained schema"
            )
        return WriterSchema(int(registered.schema_id), json.loads(registered.schema.schema_str), where)

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one registry request: None for 'not found', :class:`SchemaRegistryUnavailable` otherwise."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn()
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                return None
            raise SchemaRegistryUnavailable(
                mask_url(self.url), f"{what} (HTTP {e.http_status_code}: {e.error_message})", field=self.field
            ) from e
        except SchemaSourceError:
            raise
        except Exception as e:  # transport errors of the HTTP client, timeouts, DNS
            raise SchemaRegistryUnavailable(
                mask_url(self.url), f"{what} ({type(e).__name__}: {e})", field=self.field
            ) from e


AVRO_DTYPES: dict[str, Any] = {
    "int": "Int32",
    "long": "Int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": object,
}
