"""--server-info: /server_info read as hostile input (exit 16 with the reason): the answer capped
at MAX_BYTES in one deadline, redirects kept within the origin so the token goes nowhere else."""

import contextlib
import http.client
import re
import threading
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit, urlunsplit

from patchset.errors import BackportError, Exit

from checkinstall.launchargs import NestedTooDeeply, json_answer

MAX_BYTES = 1 << 20  # /server_info of a real server is a few KiB
MAX_REDIRECTS = 3
_UP = "check that the server is up and the URL and port are right (curl URL), then run again"
_POINT = "point it at an sglang server's /server_info"
_HINTS = {
    **dict.fromkeys((401, 403), "pass the server's key with --api-key KEY"),
    404: "point --server-info at an sglang server's /server_info (0.5.13 and later)",
}


def _refuse(url: str, why: str, next_step: str = _UP) -> BackportError:
    return BackportError(Exit.ENVIRONMENT, f"--server-info {url}: {why}", next_step)


def _target(url: str) -> tuple[SplitResult, str, str]:
    """The URL's parts, the request target (path ending in /server_info) and the URL."""
    example = "pass e.g. http://HOST:30000"
    shown = repr(re.sub(r"^([^/]*//)[^/?#]*@", r"\1", url))  # without what stands before an @
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as err:
        raise _refuse(shown, f"not a URL ({err})", example) from None
    if "@" in parts.netloc:
        raise _refuse(
            shown,
            "the URL holds credentials (USER:PASSWORD@), which are neither sent nor printed",
            "pass the URL without them, and a bearer token with --api-key KEY",
        )
    if re.search(r"[\x00-\x20\x7f]", url):
        raise _refuse(shown, "the URL holds spaces or control characters", example)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refuse(shown, "not an http:// or https:// URL with a host", example)
    path = parts.path.rstrip("/")
    path += "" if path.endswith("server_info") else "/server_info"
    target = path + (f"?{parts.query}" if parts.query else "")
    return parts, target, urlunsplit((parts.scheme, parts.netloc, target, "", ""))


def _exchange(
    parts: SplitResult, target: str, headers: dict[str, str], shown: str, timeout: float
) -> tuple[int, str, bytes]:
    origin, https = (parts.scheme, parts.hostname, parts.port), parts.scheme == "https"
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    for _hop in range(MAX_REDIRECTS + 1):
        # the port always given: http.client would read one out of an IPv6 address's colons
        conn = kind(parts.hostname, parts.port or (443 if https else 80), timeout=timeout)
        try:
            conn.request("GET", target, headers=headers)
            answer, body = conn.getresponse(), bytearray()
            length = answer.getheader("Content-Length") if answer.status == 200 else None
            announced = int(length) if length and length.strip().isdigit() else 0
            big = f"its answer is larger than {MAX_BYTES} bytes"
            if announced > MAX_BYTES:
                raise _refuse(shown, f"{big} (it announces {announced} bytes)", _POINT)
            while answer.status == 200 and (chunk := answer.read(1 << 16)):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise _refuse(shown, f"{big} (its body goes on past that)", _POINT)
            if answer.status == 200 and answer.length:
                raise http.client.IncompleteRead(bytes(body), answer.length)
        except (OSError, http.client.HTTPException, ValueError) as err:
            why = f"no usable answer: {type(err).__name__}: {err}".rstrip(": ")
            if isinstance(err, TimeoutError):
                why = f"no whole answer within {timeout:g} s (timed out)"
            raise _refuse(shown, why[:300]) from None
        finally:
            conn.close()
        if answer.status not in (301, 302, 303, 307, 308):
            return answer.status, answer.reason, bytes(body)
        moved = urlsplit(urljoin(shown, answer.headers.get("Location", "")))
        there = None
        with contextlib.suppress(ValueError):  # a port that is not a number
            there = (moved.scheme, moved.hostname, moved.port)
        if there != origin or moved.username or moved.password:
            where = f"{moved.scheme}://{moved.netloc.rpartition('@')[2]}"
            raise _refuse(
                shown,
                f"it redirects (HTTP {answer.status}) to another origin, {where!r}: not followed, "
                "and the token was not sent there",
                "pass the URL of the server itself (its host and port)",
            )
        target = moved.path + (f"?{moved.query}" if moved.query else "")
    raise _refuse(shown, f"more than {MAX_REDIRECTS} redirects")


def read_server_info(url: str, api_key: str | None, timeout: float) -> tuple[dict[str, Any], str]:
    """The server arguments at /server_info, and its URL as it may be printed."""
    parts, target, shown = _target(url)
    headers = {"Accept": "application/json", "Connection": "close"}
    if api_key:
        if re.search(r"[^\x20-\x7e\x80-\xff]", api_key):  # a control, or not latin-1
            raise BackportError(
                Exit.ENVIRONMENT,
                "--api-key holds a control character (a newline?) or a character an HTTP "
                "header cannot carry; nothing was sent",
                "pass the key as the server has it, without a trailing newline "
                "(e.g. --api-key \"$(cat key | tr -d '\\n')\")",
            )
        headers["Authorization"] = f"Bearer {api_key}"
    # one deadline for the whole exchange, the name lookup too (getaddrinfo takes no timeout):
    # a server that keeps the answer alive one byte at a time is left to the daemon thread
    done: list[Any] = []

    def run() -> None:
        try:
            done.append(_exchange(parts, target, headers, shown, timeout))
        except BaseException as err:  # raised again in the caller's thread
            done.append(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if not done:
        raise _refuse(shown, f"no whole answer within {timeout:g} s (timed out)")
    if isinstance(done[0], BaseException):
        raise done[0]
    status, reason, body = done[0]
    if status != 200:
        hint = _HINTS.get(status, "check that the URL is an sglang server's /server_info")
        raise _refuse(shown, f"it answered HTTP {status} {reason}", hint)
    try:
        info = json_answer(body)
    except ValueError as err:
        why = str(err) if isinstance(err, NestedTooDeeply) else f"starts {body[:60]!r}"
        raise _refuse(shown, f"its answer is not JSON this command reads ({why})", _POINT) from None
    if isinstance(info, dict) and isinstance(info.get("server_args"), dict):
        info = info["server_args"]
    if not isinstance(info, dict) or "disaggregation_mode" not in info:
        raise _refuse(shown, "its JSON holds no server arguments (no disaggregation_mode)", _POINT)
    return info, shown
