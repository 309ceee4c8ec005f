"""A headless Chromium driven over the DevTools protocol, for the tests that render pages.

No Python dependency: Chromium talks CDP over two pipes (``--remote-debugging-pipe``: it reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4). Debian ships the
browser as ``chromium-headless-shell`` (or ``chromium``, which runs headless with the same
flags); :func:`chromium_binary` finds it and installs the Debian package when it is missing and
this process may (root + apt-get), as launch/test.sh does before the suite.

The network here is closed: the flags turn off every background connection (component updates,
sync, safe browsing, QUIC), so a page only reaches what it asks for (loopback servers, data: URIs).

    with Browser(tmp_path / "profile") as b:
        page = b.open("http://127.0.0.1:9090/consoles/geodml.html", width=1400, height=900)
        page.wait_for("document.querySelectorAll('svg path').length > 3", timeout_s=30)
        page.screenshot(tmp_path / "shot.png")
        assert not page.errors
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.debpkg import debian_binary

PACKAGES = ("chromium-headless-shell", "chromium")
BINARIES = ("chromium-headless-shell", "chromium", "chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
         "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars", "--force-color-profile=srgb",
         "--remote-debugging-pipe")


class BrowserError(RuntimeError):
    """The browser did not answer in time, or a command failed (the message says which)."""


def _which() -> str | None:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_binary() -> tuple[str | None, str]:
    """(path, "") of a headless-capable Chromium, or (None, why not). Installs Debian's
    ``chromium-headless-shell`` (else ``chromium``) when missing, if root with apt-get."""
    return debian_binary(BINARIES, PACKAGES)


class Page:
    """One tab: navigate, evaluate JavaScript, screenshot; collects the page's errors.

    ``errors`` lists what went wrong while the page loaded and ran: uncaught exceptions,
    ``console.error`` calls, failed requests and HTTP responses >= 400 (each a string).
    """

    def __init__(self, browser: "Browser", session: str) -> None:
        self.browser = browser
        self.session = session
        self.errors: list[str] = []
        self.console: list[str] = []

    def call(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict:
        return self.browser.call(method, params, session=self.session, timeout_s=timeout_s)

    def _event(self, method: str, params: dict) -> None:
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append(f"exception: {(d.get('exception') or {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params['type']}: {text}")
            if params["type"] in ("error", "assert"):
                self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            self.errors.append(f"request failed: {params.get('errorText')} ({params.get('requestId')})")
        elif method == "Network.responseReceived":
            r = params["response"]
            if r.get("status", 0) >= 400:
                self.errors.append(f"HTTP {r['status']}: {r['url']}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            e = params["entry"]
            self.errors.append(f"log: {e.get('text')} {e.get('url', '')}".strip())

    def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        """Load ``url`` and wait for its load event."""
        self.browser.events_of(self.session, "Page.loadEventFired", clear=True)
        r = self.call("Page.navigate", url=url)
        if r.get("errorText"):
            raise BrowserError(f"cannot load {url}: {r['errorText']}")
        self.browser.wait_event(self.session, "Page.loadEventFired", timeout_s)

    def evaluate(self, expression: str, timeout_s: float = 30.0) -> Any:
        """The JSON value of a JavaScript expression (promises are awaited)."""
        r = self.call("Runtime.evaluate", timeout_s=timeout_s, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}...: {(d.get('exception') or {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, poll_s: float = 0.25) -> Any:
        """Poll a JavaScript expression until it is truthy; its value, or BrowserError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(poll_s)
        raise BrowserError(f"timed out after {timeout_s:.0f} s waiting for {expression!r} (last value {value!r}); "
                           f"page errors: {self.errors}")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Write a PNG of the page (the whole scrollable page with ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:  # the viewport grows to the page, so fixed elements (toolbars) sit at its bottom
            m = self.call("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            width, height = int(size["width"]), int(size["height"])
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            self.evaluate("new Promise(function (r) { requestAnimationFrame(function () { setTimeout(r, 100); }); })")
        data = self.call("Page.captureScreenshot", timeout_s=60, **params)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path


class Browser:
    """A headless Chromium process with its own empty profile; a context manager that always
    kills the process (and its helpers: it runs in its own process group)."""

    def __init__(self, profile_dir: Path, binary: str | None = None, extra_flags: tuple[str, ...] = ()) -> None:
        self.binary = binary or _which()
        if self.binary is None:
            raise BrowserError("no chromium-headless-shell or chromium on PATH (tests/browser.py: chromium_binary)")
        self.profile_dir = Path(profile_dir)
        self.extra_flags = extra_flags
        self.proc: subprocess.Popen | None = None
        self._next_id = 0
        self._buf = b""
        self._replies: dict[int, dict] = {}
        self._events: list[tuple[str | None, str, dict]] = []
        self.pages: dict[str, Page] = {}

    # ---- process ------------------------------------------------------------------------
    def __enter__(self) -> "Browser":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, its fd 4 carries the replies
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # never clobber one pipe end with the other
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        cmd = [self.binary, *FLAGS, *self.extra_flags, f"--user-data-dir={self.profile_dir}", "about:blank"]
        self._log = open(self.profile_dir.parent / f"{self.profile_dir.name}.log", "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=fds, pass_fds=(3, 4), start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self.call("Browser.getVersion", timeout_s=30)

    def close(self) -> None:
        """Kill the browser and everything it started; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()

    # ---- protocol -----------------------------------------------------------------------
    def _pump(self, timeout_s: float) -> None:
        """Read what the browser wrote within ``timeout_s`` and file replies and events."""
        ready, _, _ = select.select([self._from_child], [], [], max(0.0, timeout_s))
        if not ready:
            return
        chunk = os.read(self._from_child, 1 << 20)
        if not chunk:
            code = self.proc.poll() if self.proc else None
            raise BrowserError(f"the browser closed its pipe (exit code {code}); log: {self._log.name}")
        self._buf += chunk
        while b"\0" in self._buf:
            raw, self._buf = self._buf.split(b"\0", 1)
            msg = json.loads(raw)
            if "id" in msg:
                self._replies[msg["id"]] = msg
            else:
                session, method, params = msg.get("sessionId"), msg["method"], msg.get("params", {})
                self._events.append((session, method, params))
                page = self.pages.get(session or "")
                if page is not None:
                    page._event(method, params)

    def call(self, method: str, params: dict | None = None, *, session: str | None = None, timeout_s: float = 30.0) -> dict:
        """Send one command and wait for its reply; BrowserError on an error reply or timeout."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while self._next_id not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no reply in {timeout_s:.0f} s")
            self._pump(left)
        reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def events_of(self, session: str | None, method: str, clear: bool = False) -> list[dict]:
        found = [p for s, m, p in self._events if s == session and m == method]
        if clear:
            self._events = [e for e in self._events if not (e[0] == session and e[1] == method)]
        return found

    def wait_event(self, session: str | None, method: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.events_of(session, method)
            if found:
                return found[-1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no {method} within {timeout_s:.0f} s")
            self._pump(min(left, 0.5))

    def open(self, url: str, *, width: int = 1400, height: int = 900, timeout_s: float = 30.0) -> Page:
        """A new tab of ``width`` x ``height`` CSS pixels that has loaded ``url``."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self.pages[session] = page
        for domain in ("Page", "Runtime", "Network", "Log"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        page.navigate(url, timeout_s)
        return page
