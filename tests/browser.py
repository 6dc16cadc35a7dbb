"""A real headless Chromium the tests drive over the DevTools protocol, for what only a laid-out page
shows (what a window of a given width cuts off): `--remote-debugging-pipe` speaks the protocol's JSON
messages, each ended by a NUL byte, on file descriptors 3 (to Chromium) and 4 (from it), so no
WebSocket client is needed. Debian's chromium (.ci/install-chromium.sh); tests skip without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page of `width` x `height` CSS pixels; `close()` ends it."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        assert CHROMIUM is not None
        to_child, self._writer = os.pipe()  # Chromium reads commands on its fd 3
        self._reader, from_child = os.pipe()  # and writes answers on its fd 4

        def pipes_at_3_and_4() -> None:
            high_in, high_out = os.dup(to_child), os.dup(from_child)  # out of the way of 3 and 4
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe"]
        args += [f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # what pipes_at_3_and_4 puts at 3 and 4 must stay (the rest is close-on-exec)
            preexec_fn=pipes_at_3_and_4,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        attached = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self._session = attached["sessionId"]
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.call("Emulation.setDeviceMetricsOverride", session=True, **metrics)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events on the way are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._writer, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._receive()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def _receive(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._reader, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def open(self, url: str) -> None:
        """Load `url` in the page."""
        self.call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Evaluate until the expression is truthy (a JS app renders after its data arrives)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is still loading (no body yet)
                value = None
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def close(self) -> None:
        """End Chromium (and its children: it reaps them when its parent goes)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._writer)
        os.close(self._reader)
