"""E2B's signed file URLs (``download_url``, ``upload_url``): served with no headers, for one
sandbox, path and operation, until they expire or the sandbox ends."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest
from e2b_code_interpreter import Sandbox
from tests.e2b_compat.conftest import E2BService
from tests.service.server import add_tenant

from sandcell.e2b.signed_urls import signature_for
from sandcell.service.tenants import TenantStore


@pytest.fixture()
def sbx(e2b_service: E2BService) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


def _with(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.update(changes)
    return parts._replace(query=urllib.parse.urlencode(query)).geturl()


def test_a_download_url_serves_the_file_with_no_headers(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/report.txt", "signed")
    url = sbx.download_url("/home/user/report.txt")
    reply = httpx.get(url, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.content == b"signed"
    expiring = sbx.download_url("/home/user/report.txt", use_signature_expiration=600)
    assert httpx.get(expiring, timeout=120).content == b"signed"


def test_an_upload_url_writes_the_file(sbx: Sandbox) -> None:
    url = sbx.upload_url("/home/user/up.txt", use_signature_expiration=600)
    reply = httpx.post(url, files={"file": ("up.txt", b"uploaded")}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()[0]["path"] == "/home/user/up.txt"
    assert sbx.files.read("/home/user/up.txt") == "uploaded"


def test_a_signature_holds_for_its_path_and_operation_only(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/a.txt", "a")
    sbx.files.write("/home/user/b.txt", "b")
    url = sbx.download_url("/home/user/a.txt")
    other_path = httpx.get(_with(url, path="/home/user/b.txt"), timeout=120)
    assert other_path.status_code == 401
    assert "does not hold" in other_path.json()["message"]
    # A download URL does not upload.
    upload = httpx.post(url, files={"file": ("a.txt", b"planted")}, timeout=120)
    assert upload.status_code == 401
    assert sbx.files.read("/home/user/a.txt") == "a"
    # Its expiration is signed too: moving it breaks the signature.
    expiring = sbx.download_url("/home/user/a.txt", use_signature_expiration=60)
    later = str(int(time.time()) + 3600)
    assert httpx.get(_with(expiring, signature_expiration=later), timeout=120).status_code == 401


def test_an_expired_url_is_refused(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/old.txt", "old")
    token = sbx._envd_access_token
    assert token is not None
    past = int(time.time()) - 10
    url = sbx.download_url("/home/user/old.txt")
    signature = signature_for("/home/user/old.txt", "read", "", token, past)
    reply = httpx.get(_with(url, signature=signature, signature_expiration=str(past)), timeout=120)
    assert reply.status_code == 401
    assert "expired" in reply.json()["message"]


def test_a_url_is_refused_once_its_sandbox_ends(e2b_service: E2BService) -> None:
    sbx = Sandbox.create()
    sbx.files.write("/home/user/gone.txt", "gone")
    url = sbx.download_url("/home/user/gone.txt")
    assert httpx.get(url, timeout=120).status_code == 200
    sbx.kill()
    assert httpx.get(url, timeout=120).status_code == 401


def test_a_url_is_refused_once_its_tenants_key_is_rotated(e2b_service: E2BService) -> None:
    keys = [add_tenant(e2b_service.proc.home, "dora")]
    sbx = Sandbox.create(api_key=keys[0], api_url=e2b_service.url, sandbox_url=e2b_service.url)
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        url = sbx.download_url("/home/user/kept.txt", use_signature_expiration=3600)
        assert httpx.get(url, timeout=120).status_code == 200
        with TenantStore.in_home(e2b_service.proc.home) as store:
            keys.append(store.rotate_key("dora"))
        # The sandbox came with the old key, and so did the token that signed the URL.
        assert httpx.get(url, timeout=120).status_code == 401
    finally:
        # Already ended by the rotation: the kill finds nothing.
        assert Sandbox.kill(sbx.sandbox_id, api_key=keys[-1], api_url=e2b_service.url) is False
