"""Headless Chromium driven over the Chrome DevTools Protocol (no browser download, no node).

Used by ``tests/test_jupyterlab.py``. Chromium is the Debian package (``make chromium``); the
protocol runs over one websocket (``websocket-client``) to a single page target.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import websocket

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # required as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--mute-audio",
    "--password-store=basic",
    "--window-size=1400,1000",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class CDPError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _stop_group(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a process started with ``start_new_session=True`` and everything in its group."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:  # children (renderers, zygote) may outlive the browser process briefly
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Browser:
    """One headless Chromium process with one page target attached over CDP."""

    def __init__(self, executable: str, workdir: Path, start_timeout: float = 30.0):
        self.workdir = Path(workdir)
        profile = self.workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "chromium.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ws: websocket.WebSocket | None = None
        self._id = 0
        self.events: list[dict] = []
        try:
            port = self._wait_devtools_port(profile / "DevToolsActivePort", start_timeout)
            self.ws = websocket.create_connection(
                self._page_ws_url(port, start_timeout), timeout=30, suppress_origin=True
            )
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            # a headless page never has OS focus; apps that track focus (JupyterLab's current
            # widget) need the page to believe it is focused
            self.send("Emulation.setFocusEmulationEnabled", enabled=True)
        except BaseException:
            self.close()
            raise

    def _wait_devtools_port(self, path: Path, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                first = path.read_text().splitlines()[0]
                return int(first)
            except (FileNotFoundError, IndexError, ValueError):
                time.sleep(0.1)
        raise CDPError(f"chromium did not open a DevTools port in {timeout}s: {self.log_tail()}")

    def _page_ws_url(self, port: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise CDPError("chromium has no page target")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # --- protocol -------------------------------------------------------------------------

    def send(self, method: str, timeout: float = 30.0, **params) -> dict:
        assert self.ws is not None
        self._id += 1
        msg_id = self._id
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"{method}: no reply in {timeout}s")
            self.ws.settimeout(left)
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException as e:
                raise CDPError(f"{method}: no reply in {timeout}s") from e
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str, timeout: float = 30.0):
        """Evaluate JS in the page (promises awaited) and return its JSON value."""
        res = self.send(
            "Runtime.evaluate",
            timeout=timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"JS exception: {text}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, what: str, interval: float = 0.25):
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.evaluate(expression)
            if last:
                return last
            time.sleep(interval)
        raise CDPError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")

    def navigate(self, url: str) -> None:
        res = self.send("Page.navigate", url=url)
        if res.get("errorText"):
            raise CDPError(f"navigate {url}: {res['errorText']}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def console_errors(self) -> list[str]:
        out = []
        for ev in self.events:
            if ev["method"] == "Runtime.exceptionThrown":
                d = ev["params"]["exceptionDetails"]
                out.append(d.get("exception", {}).get("description") or d.get("text", ""))
            elif ev["method"] == "Runtime.consoleAPICalled" and ev["params"]["type"] == "error":
                args = ev["params"].get("args", [])
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif ev["method"] == "Log.entryAdded" and ev["params"]["entry"]["level"] == "error":
                out.append(ev["params"]["entry"].get("text", ""))
        return out

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        _stop_group(self.proc, timeout=5.0)
        self._log.close()
