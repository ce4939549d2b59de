"""Headless Chromium for tests, driven over the W3C WebDriver protocol by Debian's chromedriver.

The packages are Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium`` and
``/usr/bin/chromedriver``), which ``make test`` installs. Chromium runs with the flags that keep
it off this machine's closed network (no background networking, component updates or sync) and a
fresh profile. The client is a few WebDriver calls over urllib: no driver download, no selenium.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests import warm

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
)
# Set by `make test`, which installs the packages: there a missing browser is a failure.
REQUIRE_ENV = "TRN_REQUIRE_CHROMIUM"


def binaries() -> tuple[str, str]:
    """The paths of chromium and chromedriver; skips the test where they are not installed
    (unless :data:`REQUIRE_ENV` is set, as ``make test`` sets it)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail("chromium and chromedriver are not installed (make test installs them)")
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    return chromium, driver


class Session:
    """One WebDriver session: navigate, run a script, print the page."""

    def __init__(self, url: str, session_id: str) -> None:
        self.url, self.id = url, session_id

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return _request(method, f"{self.url}/session/{self.id}{path}", body)

    def open(self, address: str) -> None:
        self._call("POST", "/url", {"url": address})

    def run(self, script: str) -> Any:
        """The value of ``script`` (a function body that returns it) in the page."""
        return self._call("POST", "/execute/sync", {"script": script, "args": []})

    def print_pdf(self) -> bytes:
        """The page as the browser prints it (A4 by default), as PDF bytes."""
        import base64

        return base64.b64decode(self._call("POST", "/print", {"background": True}))


def _request(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["value"]


@contextmanager
def chromium() -> Iterator[Session]:
    """A headless Chromium page, closed afterwards."""
    binary, driver = binaries()
    port = warm.free_port()
    profile = tempfile.mkdtemp(prefix="trn-chromium-")
    process = subprocess.Popen(
        [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process)
        capabilities = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"],
            },
        }
        created = _request(
            "POST", f"{url}/session", {"capabilities": {"alwaysMatch": capabilities}}
        )
        session = Session(url, created["sessionId"])
        try:
            yield session
        finally:
            _request("DELETE", f"{url}/session/{session.id}")
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromedriver exited with {process.returncode}")
        try:
            if _request("GET", f"{url}/status").get("ready"):
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"chromedriver did not get ready within {timeout} s")
