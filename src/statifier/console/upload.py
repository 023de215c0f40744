"""A ``multipart/form-data`` body (a form with a file) read under a size bound.

:func:`parse_form_data` reads the fields and files of a body already read in full by
the caller, at most :data:`MAX_PARTS` of them, with the standard library's MIME
parser: the console then needs no multipart package.

>>> body = (
...     b"--b\\r\\n"
...     b'Content-Disposition: form-data; name="csrf"\\r\\n\\r\\n'
...     b"t0k3n\\r\\n"
...     b"--b\\r\\n"
...     b'Content-Disposition: form-data; name="chart"; filename="order.scxml"\\r\\n'
...     b"Content-Type: application/xml\\r\\n\\r\\n"
...     b"<scxml/>\\r\\n"
...     b"--b--\\r\\n"
... )
>>> form = parse_form_data("multipart/form-data; boundary=b", body)
>>> form.fields["csrf"], form.files["chart"]
('t0k3n', FileField(filename='order.scxml', content=b'<scxml/>'))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from email import policy
from email.parser import BytesParser
from typing import Final

__all__ = ["MAX_PARTS", "BadForm", "FileField", "FormData", "parse_form_data"]

MAX_PARTS: Final = 20
"""The most parts (fields and files) one form has."""


class BadForm(ValueError):  # noqa: N818 - names the refusal
    """The body is not a ``multipart/form-data`` form the console reads."""


@dataclass(frozen=True, slots=True)
class FileField:
    """An uploaded file: the name the browser gave it (possibly empty) and its bytes."""

    filename: str
    content: bytes


@dataclass(frozen=True, slots=True)
class FormData:
    """The text fields (UTF-8) and the files of a form, by field name (the last of a
    repeated name wins)."""

    fields: Mapping[str, str]
    files: Mapping[str, FileField]


def parse_form_data(content_type: str, body: bytes) -> FormData:
    """The fields and files of ``body``, sent with ``content_type``.

    Raises:
        BadForm: not ``multipart/form-data`` with a boundary, more than
            :data:`MAX_PARTS` parts, a part without a name, or a text field that is not
            UTF-8.
    """
    if not content_type.lower().startswith("multipart/form-data") or "boundary=" not in (
        content_type.lower()
    ):
        raise BadForm("the form is not sent as multipart/form-data")
    if "\r" in content_type or "\n" in content_type:
        raise BadForm("the form's content type is malformed")
    header = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=policy.HTTP).parsebytes(header + body)
    if not message.is_multipart():
        raise BadForm("the form's body is not multipart")
    parts = list(message.iter_parts())
    if not parts or len(parts) > MAX_PARTS:
        raise BadForm(f"a form of 1 to {MAX_PARTS} fields, not {len(parts)}")
    fields: dict[str, str] = {}
    files: dict[str, FileField] = {}
    for part in parts:
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise BadForm("a part of the form has no field name")
        payload = part.get_payload(decode=True)
        content = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            files[name] = FileField(filename, content)
            continue
        try:
            fields[name] = content.decode("utf-8")
        except UnicodeDecodeError:
            raise BadForm(f"the field {name[:40]!r} is not UTF-8 text") from None
    return FormData(fields, files)
