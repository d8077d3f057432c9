"""Headless Chromium driven through the DevTools protocol, with a small standard-library websocket client.

No driver, no new dependency: Chromium opens a debugging port (its number lands in the profile's
`DevToolsActivePort`), the client connects to the page target and sends JSON commands; events (requests,
console messages, exceptions) are kept in `events` for the test to inspect.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

# Headless, offline and quiet: no GPU, no first-run pages, no background requests of Chromium's own.
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FLAGS = (*HEADLESS, "--remote-debugging-port=0")


class Browser:
    """One headless Chromium with one page; `call` sends a DevTools command and returns its result."""

    def __init__(self, chromium: str, profile: Path, width: int = 1200, height: int = 1600) -> None:
        self.proc = subprocess.Popen(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file, deadline = profile / "DevToolsActivePort", time.time() + 60
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its debugging port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10).read())
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        path = url.split(str(port), 1)[1]
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += self.sock.recv(1)
        if b" 101 " not in reply.split(b"\r\n")[0]:
            raise RuntimeError(f"websocket handshake refused: {reply[:80]!r}")
        self.next_id, self.events = 0, []

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("chromium closed the connection")
            data += chunk
        return data

    def _send(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        n = len(payload)
        size = (
            bytes([0x80 | n])
            if n < 126
            else (
                bytes([0x80 | 126]) + struct.pack(">H", n)
                if n < 65536
                else bytes([0x80 | 127]) + struct.pack(">Q", n)
            )
        )
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(b"\x81" + size + mask + masked)

    def _receive(self) -> dict:
        message = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            n = (
                struct.unpack(">H", self._read(2))[0]
                if n == 126
                else struct.unpack(">Q", self._read(8))[0]
                if n == 127
                else n
            )
            message += self._read(n)
            if first & 0x80:  # FIN: the last fragment of a message
                return json.loads(message)

    def call(self, method: str, **params) -> dict:
        """Send one DevTools command; return its result (events met on the way go to `events`)."""
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def evaluate(self, expression: str):
        """Return the value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 30) -> None:
        """Wait until a JavaScript expression is true."""
        deadline = time.time() + timeout
        while not self.evaluate(expression):
            if time.time() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """Click the middle of the element `selector` with the mouse (scrolled into view first)."""
        box = self.evaluate(
            f"(function () {{ var e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " var r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Focus `selector`, replace its text with `text` and press Enter."""
        self.evaluate(
            f"(function () {{ var e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()"
        )
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call(
                "Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13
            )

    def screenshot(self, path: Path) -> Path:
        """Save the viewport as a PNG."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path

    def errors(self) -> list[str]:
        """Return the page's uncaught exceptions and console / log errors."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                out.append(str(params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        """Return the URL of every request the page sent."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        """Stop Chromium."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # a hung browser: kill it rather than leak it
            self.proc.kill()
            self.proc.wait()
