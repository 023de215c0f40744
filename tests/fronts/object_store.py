"""A small S3-compatible object store for the tests: the part of the S3 API a Tansu
broker's ``s3://`` storage engine uses (objects put, read, listed and deleted, with
the conditional puts it coordinates by), in memory, served on a free local port by a
thread of the test process.

Tansu keeps a ``memory://`` broker's data in the broker process, so a broker stopped
and started again would come back empty. Pointed at this store (:func:`s3_environment`)
its topics, records and committed offsets live here instead, and outlive the broker
process: a test can stop the broker, start a new one on the same port and store, and
find everything where it was.

What it serves (path-style, ``/<bucket>/<key>``; signatures are not checked):

- ``PUT`` an object, with ``If-None-Match: *`` (only if absent) or ``If-Match: <etag>``
  (only if unchanged), else ``412``; ``x-amz-copy-source`` copies one;
- ``GET``/``HEAD`` an object, with ``If-None-Match`` (``304``) and ``If-Match`` (``412``)
  and a single ``Range``;
- ``DELETE`` an object; ``POST ?delete`` deletes many;
- ``GET`` a bucket with ``list-type=2``: keys by ``prefix``, rolled up at ``delimiter``,
  in pages of ``max-keys`` with a continuation token.
"""

from __future__ import annotations

import hashlib
import re
import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

__all__ = ["ObjectStore", "object_store", "s3_environment"]

_PAGE = 1000


@dataclass(frozen=True)
class _Object:
    body: bytes
    etag: str
    modified: datetime


class ObjectStore:
    """The objects, by bucket and key, and the server answering for them."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], _Object] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def put(self, bucket: str, key: str, body: bytes) -> _Object:
        stored = _Object(body, f'"{hashlib.md5(body).hexdigest()}"', datetime.now(UTC))
        self.objects[(bucket, key)] = stored
        return stored


def s3_environment(store: ObjectStore) -> dict[str, str]:
    """The environment that points a Tansu ``s3://`` storage engine at ``store``."""
    return {
        "AWS_ENDPOINT": store.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "tests",
        "AWS_SECRET_ACCESS_KEY": "tests",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }


def object_store() -> Iterator[ObjectStore]:
    """A started store, stopped when the generator closes (for fixtures)."""
    store = ObjectStore()
    store.start()
    try:
        yield store
    finally:
        store.stop()


def _handler(store: ObjectStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            """Quiet: the tests read the broker's log, not this one's."""

        # Requests.

        def do_PUT(self) -> None:
            bucket, key, _ = self._target()
            body = self._body()
            with store.lock:
                source = self.headers.get("x-amz-copy-source")
                if source is not None:
                    from_bucket, _, from_key = unquote(source).lstrip("/").partition("/")
                    copied = store.objects.get((from_bucket, from_key))
                    if copied is None:
                        self._error(404, "NoSuchKey")
                        return
                    stored = store.put(bucket, key, copied.body)
                    answer = (
                        "<CopyObjectResult><ETag>"
                        f"{escape(stored.etag)}</ETag><LastModified>"
                        f"{_iso(stored.modified)}</LastModified></CopyObjectResult>"
                    )
                    self._send(200, answer.encode(), {"ETag": stored.etag})
                    return
                if not self._preconditions(store.objects.get((bucket, key))):
                    return
                stored = store.put(bucket, key, body)
            self._send(200, b"", {"ETag": stored.etag})

        def do_GET(self) -> None:
            bucket, key, query = self._target()
            if not key:
                self._list(bucket, query)
                return
            self._read(bucket, key, body=True)

        def do_HEAD(self) -> None:
            bucket, key, _ = self._target()
            self._read(bucket, key, body=False)

        def do_DELETE(self) -> None:
            bucket, key, _ = self._target()
            with store.lock:
                store.objects.pop((bucket, key), None)
            self._send(204, b"", {})

        def do_POST(self) -> None:
            bucket, _, query = self._target()
            body = self._body()
            if "delete" not in query:
                self._error(501, "NotImplemented")
                return
            keys = [
                element.text or ""
                for element in ElementTree.fromstring(body).iter()
                if element.tag.rpartition("}")[2] == "Key"
            ]
            with store.lock:
                for key in keys:
                    store.objects.pop((bucket, key), None)
            deleted = "".join(f"<Deleted><Key>{escape(key)}</Key></Deleted>" for key in keys)
            self._send(200, f"<DeleteResult>{deleted}</DeleteResult>".encode(), {})

        # Helpers.

        def _target(self) -> tuple[str, str, dict[str, list[str]]]:
            parts = urlsplit(self.path)
            bucket, _, key = parts.path.lstrip("/").partition("/")
            return unquote(bucket), unquote(key), parse_qs(parts.query, keep_blank_values=True)

        def _body(self) -> bytes:
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def _preconditions(self, current: _Object | None) -> bool:
            """Whether the request's conditions hold of ``current`` (else answered)."""
            absent_only = self.headers.get("if-none-match")
            unchanged_only = self.headers.get("if-match")
            if absent_only == "*" and current is not None:
                self._error(412, "PreconditionFailed")
                return False
            if unchanged_only is not None and (current is None or current.etag != unchanged_only):
                self._error(412 if current is not None else 404, "PreconditionFailed")
                return False
            return True

        def _read(self, bucket: str, key: str, *, body: bool) -> None:
            with store.lock:
                found = store.objects.get((bucket, key))
            if found is None:
                self._error(404, "NoSuchKey", body=body)
                return
            headers = {
                "ETag": found.etag,
                "Last-Modified": found.modified.strftime("%a, %d %b %Y %H:%M:%S GMT"),
            }
            if self.headers.get("if-none-match") == found.etag:
                self._send(304, b"", headers, body=False)
                return
            wanted = self.headers.get("if-match")
            if wanted is not None and wanted != found.etag:
                self._error(412, "PreconditionFailed", body=body)
                return
            content, status = found.body, 200
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("range") or "")
            if ranged is not None:
                start = int(ranged.group(1))
                end = int(ranged.group(2)) if ranged.group(2) else len(content) - 1
                end = min(end, len(content) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
                content, status = content[start : end + 1], 206
            self._send(status, content, headers, body=body)

        def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
            prefix = query.get("prefix", [""])[0]
            delimiter = query.get("delimiter", [""])[0]
            after = query.get("continuation-token", query.get("start-after", [""]))[0]
            limit = int(query.get("max-keys", [str(_PAGE)])[0])
            with store.lock:
                keys = sorted(
                    (key, found)
                    for (named, key), found in store.objects.items()
                    if named == bucket and key.startswith(prefix)
                )
            contents: list[str] = []
            prefixes: list[str] = []
            last = ""
            for key, found in keys:
                if key <= after:
                    continue
                if len(contents) + len(prefixes) >= limit:
                    break
                rest = key[len(prefix) :]
                if delimiter and delimiter in rest:
                    rolled = prefix + rest.split(delimiter, 1)[0] + delimiter
                    if rolled not in prefixes:
                        prefixes.append(rolled)
                    last = rolled + "\U0010ffff"
                    continue
                last = key
                contents.append(
                    f"<Contents><Key>{escape(key)}</Key><LastModified>{_iso(found.modified)}"
                    f"</LastModified><ETag>{escape(found.etag)}</ETag>"
                    f"<Size>{len(found.body)}</Size></Contents>"
                )
            truncated = any(key > last for key, _ in keys) and bool(last)
            more = (
                f"<NextContinuationToken>{escape(last)}</NextContinuationToken>"
                if truncated
                else ""
            )
            rolled_up = "".join(
                f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes
            )
            answer = (
                '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
                f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
                f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
                f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
                f"{''.join(contents)}{rolled_up}{more}</ListBucketResult>"
            )
            self._send(200, answer.encode(), {"Content-Type": "application/xml"})

        def _error(self, status: int, code: str, *, body: bool = True) -> None:
            text = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self._send(status, text, {"Content-Type": "application/xml"}, body=body)

        def _send(
            self, status: int, content: bytes, headers: dict[str, str], *, body: bool = True
        ) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if body and content:
                self.wfile.write(content)

    return Handler


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")
