"""Key buckets: an address's bucket, carried by the ids minted for it, and an
execution's bucket read back from its id; all fixed for ever."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statifier.buckets import BUCKETS, address_bucket, bucket_of, tagged
from statifier.ids import new_execution_id

names = st.text(max_size=40)


def hashed(root: str) -> int:
    """The bucket of an id that carries none, as decision 0116 fixed it."""
    digest = hashlib.blake2b(root.encode(), digest_size=8, person=b"statifier.bkt").digest()
    return int.from_bytes(digest, "big") % BUCKETS


def test_address_buckets_never_change() -> None:
    # Computed once and written down: a change would move every address minted before.
    assert [address_bucket("web", "order", f"o-{n}") for n in range(5)] == [
        1002,
        501,
        566,
        911,
        289,
    ]
    assert address_bucket("", "", "") == 143


@given(names, names, names)
def test_an_id_minted_for_an_address_falls_in_its_bucket(
    scope: str, document: str, key: str
) -> None:
    minted = new_execution_id(scope, document, key)
    assert bucket_of(minted) == address_bucket(scope, document, key)
    assert bucket_of(f"{minted}/payment/2") == bucket_of(minted)
    assert minted.startswith("ex_")
    assert len(minted) == 33


def test_an_id_without_an_address_is_hashed_as_before() -> None:
    plain = new_execution_id()
    assert len(plain) == 29
    assert bucket_of(plain) == hashed(plain)
    # Ids that only look minted (a bucket past the last, not hex, a bad ULID) are hashed.
    for lookalike in (
        "ex_01KBCDEFGHJKMNPQRSTVWXYZ01_400",
        "ex_01KBCDEFGHJKMNPQRSTVWXYZ01_0g0",
        "ex_01KBCDEFGHJKMNPQRSTVWXYZ0U_001",
    ):
        assert bucket_of(lookalike) == hashed(lookalike)
    assert bucket_of("ex_01KBCDEFGHJKMNPQRSTVWXYZ01_3ff") == 1023


def test_a_tag_names_one_of_the_buckets() -> None:
    assert tagged(0) == "_000"
    assert tagged(BUCKETS - 1) == "_3ff"
    for wrong in (-1, BUCKETS):
        with pytest.raises(ValueError, match="a bucket is from 0 to 1023"):
            tagged(wrong)
