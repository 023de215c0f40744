"""The console's multipart form reader: any fields and files httpx encodes (an encoder
of its own) read back as they were sent; forms it does not read are refused by type."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.console.upload import MAX_PARTS, BadForm, FileField, parse_form_data

_NAMES = st.text(
    alphabet=st.characters(codec="ascii", categories=("L", "N"), include_characters="_-"),
    min_size=1,
    max_size=12,
)
_FILENAMES = st.text(
    alphabet=st.characters(codec="ascii", categories=("L", "N"), include_characters="._-"),
    min_size=1,
    max_size=20,
)


def _encoded(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[str, bytes]:
    request = httpx.Request(
        "POST",
        "http://127.0.0.1/console/revisions",
        data=fields,
        files={name: (filename, content) for name, (filename, content) in files.items()},
    )
    return request.headers["content-type"], request.read()


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(_NAMES, st.text(max_size=40), max_size=5),
    files=st.dictionaries(
        _NAMES.map(lambda name: f"file_{name}"),
        st.tuples(_FILENAMES, st.binary(max_size=300)),
        min_size=1,
        max_size=3,
    ),
)
def test_what_httpx_encodes_reads_back_as_sent(
    fields: dict[str, str], files: dict[str, tuple[str, bytes]]
) -> None:
    content_type, body = _encoded(fields, files)
    form = parse_form_data(content_type, body)
    # Every character of a field and every byte of a file, line breaks included.
    assert dict(form.fields) == fields
    assert dict(form.files) == {
        name: FileField(filename, content) for name, (filename, content) in files.items()
    }


def test_forms_it_does_not_read_are_refused() -> None:
    content_type, body = _encoded({}, {"chart": ("a.scxml", b"<scxml/>")})
    with pytest.raises(BadForm, match="multipart/form-data"):
        parse_form_data("application/x-www-form-urlencoded", b"a=1")
    with pytest.raises(BadForm, match="multipart/form-data"):
        parse_form_data("multipart/form-data", body)  # no boundary
    with pytest.raises(BadForm, match="malformed"):
        parse_form_data(content_type + "\r\nX-Other: 1", body)
    many = {f"f{n}": "x" for n in range(MAX_PARTS)}
    content_type, body = _encoded(many, {"chart": ("a.scxml", b"<scxml/>")})
    with pytest.raises(BadForm, match=f"1 to {MAX_PARTS} fields, not {MAX_PARTS + 1}"):
        parse_form_data(content_type, body)
    boundary = "b0undary"
    nameless = (
        f"--{boundary}\r\nContent-Disposition: form-data\r\n\r\nx\r\n--{boundary}--\r\n"
    ).encode()
    with pytest.raises(BadForm, match="no field name"):
        parse_form_data(f"multipart/form-data; boundary={boundary}", nameless)
    latin = (
        (f'--{boundary}\r\nContent-Disposition: form-data; name="document"\r\n\r\n').encode()
        + b"caf\xe9\r\n"
        + f"--{boundary}--\r\n".encode()
    )
    with pytest.raises(BadForm, match="not UTF-8"):
        parse_form_data(f"multipart/form-data; boundary={boundary}", latin)
