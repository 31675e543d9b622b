"""A minimal Language Server Protocol client for the tests: JSON-RPC over a subprocess's pipes."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path


class LspClient:
    def __init__(self, cwd: Path, env: dict | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tcaudit", "server"], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        )
        self.messages: "queue.Queue[dict]" = queue.Queue()
        self.notifications: list[dict] = []
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            headers = {}
            while True:
                line = stream.readline()
                if not line:
                    return
                line = line.decode("ascii").strip()
                if not line:
                    break
                key, _, value = line.partition(":")
                headers[key.lower()] = value.strip()
            body = stream.read(int(headers["content-length"]))
            self.messages.put(json.loads(body))

    def send(self, message: dict) -> None:
        body = json.dumps(message).encode("utf-8")
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float = 120) -> dict:
        self._next += 1
        ident = self._next
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            message = self._take(deadline)
            if message.get("id") == ident and "method" not in message:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result")
            self._other(message)

    def _take(self, deadline: float) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no answer from the server in time; stderr: {self.stderr_tail()}")
        try:
            return self.messages.get(timeout=left)
        except queue.Empty:
            raise AssertionError(f"no answer from the server in time; stderr: {self.stderr_tail()}") from None

    def _other(self, message: dict) -> None:
        if "method" in message and "id" in message:  # a request from the server (none expected): answer null
            self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
        self.notifications.append(message)

    def wait_for(self, method: str, predicate=lambda params: True, timeout: float = 120) -> dict:
        """The next notification ``method`` whose params satisfy ``predicate`` (earlier ones are kept)."""
        for message in self.notifications:
            if message.get("method") == method and predicate(message["params"]):
                self.notifications.remove(message)
                return message["params"]
        deadline = time.monotonic() + timeout
        while True:
            message = self._take(deadline)
            if message.get("method") == method and predicate(message.get("params")):
                return message["params"]
            self._other(message)

    def initialize(self, root: Path, options: dict | None = None, document_changes: bool = True,
                   resolves_edits: bool = False) -> dict:
        text_document: dict = {"publishDiagnostics": {"relatedInformation": True}}
        if resolves_edits:  # as Neovim and VS Code say: a code action's edit may come on codeAction/resolve
            text_document["codeAction"] = {"dataSupport": True, "resolveSupport": {"properties": ["edit"]}}
        result = self.request("initialize", {
            "processId": os.getpid(),
            "rootUri": root.as_uri(),
            "capabilities": {
                "workspace": {"workspaceEdit": {"documentChanges": document_changes}},
                "textDocument": text_document,
            },
            "initializationOptions": options or {},
        })
        self.notify("initialized", {})
        return result

    def stderr_tail(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        return self.process.stderr.read().decode("utf-8", "replace")[-2000:]

    def close(self) -> int:
        try:
            if self.process.poll() is None:
                self.request("shutdown", None, timeout=30)
                self.notify("exit", None)
            return self.process.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a test that failed before must still clean up
            self.process.kill()
            return self.process.wait()
        finally:
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                try:
                    stream.close()
                except OSError:
                    pass


def apply_text_edits(text: str, edits: list[dict]) -> str:
    """LSP text edits (UTF-16 positions) applied to ``text``, last first."""
    lines = text.splitlines(keepends=True)

    def offset(position: dict) -> int:
        line, character = position["line"], position["character"]
        if line >= len(lines):
            return len(text)
        before = sum(len(lines[i]) for i in range(line))
        units = 0
        for index, char in enumerate(lines[line]):
            if units >= character:
                return before + index
            units += 2 if ord(char) > 0xFFFF else 1
        return before + len(lines[line])

    spans = sorted(((offset(e["range"]["start"]), offset(e["range"]["end"]), e["newText"]) for e in edits), reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text
