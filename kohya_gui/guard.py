"""The server's gate: one ASGI middleware in front of every route of the app (Gradio's API,
its file routes and the page alike), added when the FastAPI app is built.

- **Host** (DNS rebinding, as Jupyter and Vite refuse it): without a login, a request whose
  ``Host`` header is not an address the server listens on (localhost, 127.0.0.1, [::1], the
  ``--listen`` address) or a name given with ``--allowed-host`` gets 403. A web page that rebinds
  its own name to 127.0.0.1 sends its own name as the Host, so it cannot drive the studio.
- **Origin** (cross-site requests): a state-changing request (anything but GET, HEAD, OPTIONS)
  whose ``Origin`` is another site than the one asked (its host and port differ from the
  ``Host`` header, and it is no allowed host) gets 403. Scripts (curl, gradio_client) send no
  Origin and pass.
- **Login** (with credentials): every route refuses an unauthenticated request with 401, except
  what the login page itself needs (the page, its static assets, ``POST /login``). Failed logins
  are counted per client address: after :data:`LOGIN_ATTEMPTS` failures within
  :data:`LOGIN_WINDOW_S` seconds, further attempts get 429 until the window has passed; every
  failure is logged with the address.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("kohya_gui.guard")

LOGIN_ATTEMPTS = 5
LOGIN_WINDOW_S = 60.0
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")
# What the login page needs before anyone has logged in: the page (Gradio answers it with the
# login form), the login itself and static files that hold nothing of the studio.
PUBLIC_EXACT = {"/", "/login", "/login/", "/favicon.ico", "/theme.css", "/gradio_api/theme.css",
                "/robots.txt", "/manifest.json", "/pwa_icon"}
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon/")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or a URL's netloc, without port or brackets, lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") > 1:  # a bare IPv6 address
        return value
    return value.rsplit(":", 1)[0] if ":" in value else value


def _same(a: str, b: str) -> bool:
    """Two host names that are the same address (``::1`` and ``0:0::1``)."""
    if a == b:
        return True
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


@dataclass
class GuardSettings:
    listen: str = "127.0.0.1"
    login: bool = False  # credentials are set
    allowed_hosts: tuple[str, ...] = ()
    login_attempts: int = LOGIN_ATTEMPTS
    login_window_s: float = LOGIN_WINDOW_S

    @property
    def known_hosts(self) -> set[str]:
        hosts = set(LOOPBACK_HOSTS) | {host_name(h) for h in self.allowed_hosts}
        if self.listen not in WILDCARDS:
            hosts.add(host_name(self.listen))
        return hosts

    @property
    def check_host(self) -> bool:
        """Without a login the Host must be known; with one, the login guards every route (a
        rebound page has no session cookie), and people reach a server by many names."""
        return not self.login


def allowed_host(host: str, settings: GuardSettings) -> bool:
    name = host_name(host)
    return bool(name) and any(_same(name, known) for known in settings.known_hosts)


def same_site(origin: str, host: str, settings: GuardSettings) -> bool:
    """Whether a request from ``origin`` to ``host`` (the Host header) is not cross-site."""
    if not origin or origin == "null":
        return False
    netloc = urlsplit(origin).netloc.lower()
    if not netloc:
        return False
    if netloc == host.strip().lower():
        return True
    name = host_name(netloc)
    return any(_same(name, host_name(h)) for h in settings.allowed_hosts)


def is_public(path: str) -> bool:
    return path in PUBLIC_EXACT or path.startswith(PUBLIC_PREFIXES)


@dataclass
class LoginLimiter:
    """Failed logins per client address in a sliding window."""

    attempts: int = LOGIN_ATTEMPTS
    window_s: float = LOGIN_WINDOW_S
    _failures: dict[str, collections.deque] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _recent(self, address: str, now: float) -> collections.deque:
        times = self._failures.setdefault(address, collections.deque())
        while times and now - times[0] > self.window_s:
            times.popleft()
        return times

    def wait_s(self, address: str, now: float | None = None) -> float:
        """Seconds until ``address`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._recent(address, now)
            if len(times) < self.attempts:
                return 0.0
            return max(0.0, self.window_s - (now - times[0]))

    def failed(self, address: str, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._recent(address, now)
            times.append(now)
            if len(self._failures) > 10_000:  # bounded: forget the quietest addresses
                for key in [k for k, v in self._failures.items() if not v][:5_000]:
                    del self._failures[key]
            return len(times)


class StudioGuard:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app: Any, settings: GuardSettings | None = None):
        self.app = app
        self.settings = settings or GuardSettings()
        self.limiter = LoginLimiter(self.settings.login_attempts, self.settings.login_window_s)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        method = scope.get("method", "GET").upper()
        address = (scope.get("client") or ("?", 0))[0]
        host = headers.get("host", "")
        s = self.settings
        if s.check_host and not allowed_host(host, s):
            log.warning("refused %s %s from %s: Host %r is not an address this server listens "
                        "on", method, path, address, host)
            await _deny(scope, receive, send, 403, (
                f"Host {host!r} is not allowed: this server answers to "
                f"{', '.join(sorted(s.known_hosts))}. Start kohya-gui with --allowed-host NAME "
                "to reach it by another name."))
            return
        origin = headers.get("origin")
        if (origin is not None and method not in SAFE_METHODS
                and not same_site(origin, host, s)) or (
                scope["type"] == "websocket" and origin is not None
                and not same_site(origin, host, s)):
            log.warning("refused %s %s from %s: Origin %r is another site than %r", method,
                        path, address, origin, host)
            await _deny(scope, receive, send, 403,
                        f"cross-site request refused (Origin {origin!r}, Host {host!r})")
            return
        if s.login:
            if path.rstrip("/") == "/login" and method == "POST":
                await self._login(scope, receive, send, address)
                return
            if not (is_public(path) or _launch_check(scope, path)
                    or _logged_in(scope, headers)):
                await _deny(scope, receive, send, 401, "Not authenticated: log in first")
                return
        await self.app(scope, receive, send)

    async def _login(self, scope: dict, receive: Any, send: Any, address: str) -> None:
        wait = self.limiter.wait_s(address)
        if wait > 0:
            log.warning("login from %s refused: %d failed logins within %.0f s (wait %.0f s)",
                        address, self.settings.login_attempts, self.settings.login_window_s,
                        wait)
            await _deny(scope, receive, send, 429,
                        f"Too many failed logins; try again in {wait:.0f} s",
                        {"retry-after": str(int(wait) + 1)})
            return
        status: list[int] = []

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status and status[0] >= 400:
            n = self.limiter.failed(address)
            log.warning("failed login from %s (%d in the last %.0f s)", address, n,
                        self.settings.login_window_s)


def _logged_in(scope: dict, headers: dict[str, str]) -> bool:
    """Whether the request carries a session cookie that Gradio's app issued."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if not isinstance(tokens, dict) or cookie_id is None:
        return False
    cookies = _cookies(headers.get("cookie", ""))
    for name in (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"):
        token = cookies.get(name)
        if token and tokens.get(token) is not None:
            return True
    return False


def _launch_check(scope: dict, path: str) -> bool:
    """Gradio's own call of ``startup-events`` while it launches (without a cookie); once the
    events have run, that route is refused like every other."""
    return (path.rstrip("/") == "/gradio_api/startup-events"
            and getattr(scope.get("app"), "startup_events_triggered", True) is False)


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name] = value
    return out


async def _deny(scope: dict, receive: Any, send: Any, status: int, message: str,
                extra: dict[str, str] | None = None) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = message.encode("utf-8")
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def middleware(listen: str, login: bool, allowed_hosts: Iterable[str] = ()) -> Any:
    """The ``starlette.middleware.Middleware`` entry for FastAPI's ``middleware=`` list."""
    from starlette.middleware import Middleware

    return Middleware(StudioGuard, settings=GuardSettings(
        listen=listen, login=login, allowed_hosts=tuple(allowed_hosts)))
