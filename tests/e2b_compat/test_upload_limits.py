"""A compressed upload is bounded by what it decompresses to, not only by what is received."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(
        api_key=e2b_service.alice, api_url=e2b_service.url, sandbox_url=e2b_service.url
    )
    yield sandbox
    sandbox.kill()


def _upload(service: E2BService, sbx: Sandbox, path: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{service.url}/files",
        params={"path": path},
        content=body,
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sbx._envd_access_token or "",
            "Content-Type": "application/octet-stream",
            "Content-Encoding": "gzip",
        },
        timeout=120,
    )


def test_a_gzip_bomb_is_refused_before_it_is_inflated(
    e2b_service: E2BService, sbx: Sandbox
) -> None:
    # 64 MiB of zeros is 64 KiB compressed: well inside the 8 MiB body limit, 8 times over it
    # once inflated (1 GiB would be 1 MiB: the ratio is the same).
    bomb = gzip.compress(bytes(64 * MiB), compresslevel=9)
    assert len(bomb) < MiB
    reply = _upload(e2b_service, sbx, "/home/user/bomb.bin", bomb)
    assert reply.status_code == 413, reply.text
    assert "decompresses to over" in reply.json()["message"]
    assert not sbx.files.exists("/home/user/bomb.bin")


def test_several_gzip_members_together_count_against_the_limit(
    e2b_service: E2BService, sbx: Sandbox
) -> None:
    # Each member alone is under the limit; together they pass it.
    member = gzip.compress(bytes(5 * MiB))
    reply = _upload(e2b_service, sbx, "/home/user/two.bin", member + member)
    assert reply.status_code == 413, reply.text
    assert not sbx.files.exists("/home/user/two.bin")


def test_gzip_under_the_limit_and_broken_gzip(e2b_service: E2BService, sbx: Sandbox) -> None:
    ok = _upload(e2b_service, sbx, "/home/user/z.txt", gzip.compress(b"a") + gzip.compress(b"b"))
    assert ok.status_code == 200, ok.text
    assert sbx.files.read("/home/user/z.txt") == "ab"
    cut = _upload(e2b_service, sbx, "/home/user/cut.txt", gzip.compress(b"x" * 10_000)[:-12])
    assert cut.status_code == 400
    assert "not valid gzip" in cut.json()["message"]
