"""An OpenAI-compatible chat-completions server for the remote-inference tests.

A real HTTP server (http.server in a thread, on a free loopback port) that speaks the
protocol; it stands in for vLLM / llama.cpp / Ollama, which cannot run here, and plays a
small model with fixed rules so tests can check what went through the wire.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "local-gemma-it"


class ChatCompletionsServer:
    """An OpenAI-compatible endpoint on a free loopback port.

    `failures` is a list of (status, headers) answered to the first requests, in order; after
    that every request gets a completion. Chats mentioning "terrible" are negative, "thank"
    positive, anything else neutral; a chat mentioning GARBAGE gets prose instead of JSON.
    """

    def __init__(self, failures: list[tuple[int, dict[str, str]]] | None = None):
        self.failures = list(failures or [])
        self.requests: list[dict] = []  # every request body received, in order
        self.answered: list[int] = []  # the status of every answer, in order
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    failure = server.failures.pop(0) if server.failures else None
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                if failure:
                    status, headers = failure
                    return self._send(status, {"error": {"message": "busy", "code": status}}, headers)
                return self._send(200, server.complete(body))

            def _send(self, status, payload, headers=None):
                with server.lock:
                    server.answered.append(status)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> ChatCompletionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def chat_of(body: dict) -> str:
        user = body["messages"][-1]["content"]
        match = re.fullmatch(r"<chat>\n(.*)\n</chat>", user, re.DOTALL)
        assert match, f"chat not fenced: {user!r}"
        return match.group(1)

    def complete(self, body: dict) -> dict:
        chat = self.chat_of(body)
        system = body["messages"][0]["content"]
        if "GARBAGE" in chat:
            content = "Sure! The customer seems a bit upset, I would say negative-ish."
        elif "draft replies" in system:
            content = json.dumps({"reply": "We are sorry for the trouble; a refund is on its way."})
        else:
            sentiment = "negative" if "terrible" in chat else "positive" if "thank" in chat else "neutral"
            first = chat.splitlines()[0].split(": ", 1)[1]
            content = json.dumps({"sentiment": sentiment, "confidence": 0.8,
                                  "summary": f"The customer wrote: {first[:40]}"})
        return {"id": "cmpl-1", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}]}

    def chats_requested(self) -> Counter:
        return Counter(self.chat_of(body).splitlines()[0] for body in self.requests)
