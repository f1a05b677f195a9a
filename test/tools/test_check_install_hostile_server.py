"""check-install --server-info against servers that misbehave, on 127.0.0.1: every bad
answer is exit 16 with its reason (no traceback), within one deadline and a size cap;
no token leaves the server's origin, no password is printed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from patchset import paths
from patchset.errors import Exit
from test_check_install_config import check, release_env

DEFAULT = paths.DEFAULT_BASE
INFO = json.dumps({"disaggregation_mode": "prefill", "disable_overlap_schedule": False}).encode()
Reply = Callable[[socket.socket, bytes], None]


class RawServer:
    """A TCP server on 127.0.0.1 that answers each request with reply(conn, request):
    whatever bytes it likes, as slowly as it likes. requests: what it was sent."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.02)  # how soon _serve sees stop (each test waits for it)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                self.requests.append(request)
                self.reply(conn, request)
            except OSError:
                pass  # the client gave up, as it should

    def __enter__(self) -> RawServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def answer(head: bytes, body: bytes = b"") -> Reply:
    def reply(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(head + body)

    return reply


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


@pytest.fixture(scope="module")
def base() -> Path:
    return release_env(DEFAULT)[1]


def ask(base: Path, url: str, *more: str) -> tuple[int, str, str]:
    result = check("--tree", str(base), "--server-info", url, *more)
    return result.returncode, result.stdout, result.stderr


def endless(conn: socket.socket, _request: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    block = b"[" + b" " * 65535
    for _ in range(1024):  # 64 MiB, then it stops: a reader that reads it all is slow
        conn.sendall(block)


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (answer(b"SSH-2.0-OpenSSH_9.6\r\n"), "no usable answer: BadStatusLine"),
        (answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"a": '), "IncompleteRead"),
        (answer(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n"), "LineTooLong"),
        (
            answer(b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n{}"),
            "got more than 100 headers",
        ),
        (
            answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
            "IncompleteRead",  # a bad chunk size
        ),
        (answer(ok(b"[" * 200_000 + b"]" * 200_000)), "not JSON this command reads (nested too"),
        (answer(ok(b"\xff\xfe{}")), "not JSON this command reads"),
        (answer(ok(b"{}")), "its JSON holds no server arguments"),
        (endless, "its answer is larger than 1048576 bytes"),
        (
            answer(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"),
            "larger than 1048576 bytes (it announces 99999999999 bytes)",
        ),
    ],
)
def test_a_bad_answer_is_exit_16_with_its_reason(base: Path, reply: Reply, said: str):
    with RawServer(reply) as server:
        started = time.monotonic()
        code, out, err = ask(base, server.url, "--timeout", "20")
        took = time.monotonic() - started
    assert code == Exit.ENVIRONMENT, out + err
    assert said in err and "next step:" in err, err
    assert took < 15, took


# Each sends a little every DRIP_S, four times within the deadline: a timeout per read
# would never fire, only one deadline for the whole answer ends it.
DRIP_S = 0.25


def drip(conn: socket.socket, _request: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(60):  # for at most 15 s
        conn.sendall(b" ")
        time.sleep(DRIP_S)


def drip_headers(conn: socket.socket, _request: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for _ in range(60):
        conn.sendall(b"X: 1\r\n")
        time.sleep(DRIP_S)


@pytest.mark.parametrize("reply", [drip, drip_headers])
def test_one_deadline_for_the_whole_answer(base: Path, reply: Reply):
    with RawServer(reply) as server:
        started = time.monotonic()
        code, out, err = ask(base, server.url, "--timeout", "1")
        took = time.monotonic() - started
    assert code == Exit.ENVIRONMENT, out + err
    assert "no whole answer within 1 s (timed out)" in err, err
    assert took < 5, took


def test_a_redirect_to_another_origin_is_refused_and_gets_no_token(base: Path):
    with RawServer(answer(ok(INFO))) as elsewhere:
        moved = b"HTTP/1.1 302 Found\r\nLocation: %s/server_info\r\nContent-Length: 0\r\n\r\n"
        with RawServer(answer(moved % elsewhere.url.encode())) as server:
            code, out, err = ask(base, server.url, "--api-key", "t0ken")
        assert elsewhere.requests == []
    assert code == Exit.ENVIRONMENT, out + err
    assert "redirects (HTTP 302) to another origin" in err and "not followed" in err, err
    assert b"Bearer t0ken" in server.requests[0]


def test_a_redirect_to_a_port_that_is_no_number_is_refused(base: Path):
    """urllib raises ValueError on such a port: the answer is a refusal, not a traceback."""
    moved = b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:abc/x\r\nContent-Length: 0\r\n\r\n"
    with RawServer(answer(moved)) as server:
        code, out, err = ask(base, server.url)
    assert code == Exit.ENVIRONMENT, out + err
    assert "to another origin" in err and "Traceback" not in err, err


def test_a_redirect_within_the_origin_is_followed(base: Path):
    def reply(conn: socket.socket, request: bytes) -> None:
        if request.startswith(b"GET /server_info "):
            conn.sendall(
                b"HTTP/1.1 307 Moved\r\nLocation: /v1/info?x=1\r\nContent-Length: 0\r\n\r\n"
            )
        else:
            conn.sendall(ok(INFO))

    with RawServer(reply) as server:
        code, out, err = ask(base, server.url, "--api-key", "t0ken")
    assert code == Exit.NOT_EXPOSED, out + err
    assert server.requests[1].startswith(b"GET /v1/info?x=1 HTTP/1.1")
    assert b"Bearer t0ken" in server.requests[1]


def test_credentials_in_the_url_are_refused_unprinted(base: Path):
    with RawServer(answer(ok(INFO))) as server:
        url = server.url.replace("http://", "http://admin:s3cret-pw@") + "/server_info"
        code, out, err = ask(base, url)
        assert server.requests == []
    assert code == Exit.ENVIRONMENT, out + err
    assert "holds credentials" in err, err
    assert "s3cret-pw" not in out + err


@pytest.mark.parametrize(
    ("path", "requested"),
    [
        ("/?x=1", b"GET /server_info?x=1 HTTP/1.1"),
        ("/sglang/", b"GET /sglang/server_info HTTP/1.1"),
        ("/sglang/server_info?a=b&c=d", b"GET /sglang/server_info?a=b&c=d HTTP/1.1"),
    ],
)
def test_the_path_and_query_are_joined(base: Path, path: str, requested: bytes):
    with RawServer(answer(ok(INFO))) as server:
        code, out, err = ask(base, server.url + path)
    assert code == Exit.NOT_EXPOSED, out + err
    assert server.requests[0].startswith(requested), server.requests


@pytest.mark.parametrize(
    "info",
    [
        {"disaggregation_mode": ["decode"]},
        {"disaggregation_mode": "Decode"},
        {"disaggregation_mode": "prefill", "disable_overlap_schedule": "false"},
    ],
)
def test_values_no_server_has_are_not_understood(base: Path, info: dict):
    """A server's answer decides 26 only with values an sglang server gives."""
    with RawServer(answer(ok(json.dumps(info).encode()))) as server:
        code, out, err = ask(base, server.url)
    assert code == Exit.EXPOSURE_UNKNOWN, out + err
    assert "answers values no sglang server has" in err, err


@pytest.mark.parametrize("key", ["k3y\n", "k3y\r\nX-Evil: 1", "k\x7fy", "k\u00e9\u20acy"])
def test_a_key_that_breaks_the_header_is_refused_before_sending(base: Path, key: str):
    with RawServer(answer(ok(INFO))) as server:
        code, out, err = ask(base, server.url, "--api-key", key)
        assert server.requests == []
    assert code == Exit.ENVIRONMENT, out + err
    assert "--api-key holds a control character" in err, err


def test_a_silent_name_server_is_under_the_deadline(monkeypatch: pytest.MonkeyPatch):
    """getaddrinfo takes no timeout: a name server that never answers must not hold the
    check past --timeout (played here by a lookup that sleeps)."""
    from checkinstall import serverinfo
    from patchset.errors import BackportError

    real = socket.getaddrinfo

    def silent(host: str, *args: object, **kwargs: object) -> object:
        if host == "sglang.invalid":
            time.sleep(10)
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", silent)
    started = time.monotonic()
    with pytest.raises(BackportError) as refused:
        serverinfo.read_server_info("http://sglang.invalid:30000/server_info", None, 1.0)
    assert time.monotonic() - started < 3
    assert refused.value.code == Exit.ENVIRONMENT
    assert "no whole answer within 1 s (timed out)" in str(refused.value)
