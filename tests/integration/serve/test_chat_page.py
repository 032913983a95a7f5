#!/usr/bin/env python3
"""The chat page of `weft serve` (GET /) in a real browser: headless Chromium, driven over the
DevTools protocol, loads the page, a message is typed into the box and sent, and the answer streams
into the page. With temperature 0 the streamed answer must equal what /v1/chat/completions returns
for the same messages without streaming; the cluster panel must list the engine worker; a wrong
API key must show the server's error in the page.

Usage: test_chat_page.py --weft PATH/TO/weft   (exit 77 = skipped: no model or no Chromium; a
failure under CI=true)
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from cli_checks import check, finish  # noqa: E402
from weft_serve import WeftServer, default_model_path  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self, binary, url):
        import websocket
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="weft-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={self.profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        target = None
        while time.time() < deadline and target is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json", timeout=2) as r:
                    pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
                    target = pages[0] if pages else None
            except OSError:
                time.sleep(0.2)
        if target is None:
            raise RuntimeError("Chromium did not open its DevTools port")
        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        return r.get("result", {}).get("value")

    def wait_for(self, expression, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(expression)
            if v:
                return v
            time.sleep(0.2)
        return None

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - closing a dead socket is fine
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def type_and_send(b, text):
    b.js(f"""(() => {{ const i = document.getElementById('input');
        i.value = {json.dumps(text)};
        document.getElementById('send').click(); return true; }})()""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    a = ap.parse_args()
    ci = os.environ.get("CI", "") not in ("", "0", "false")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = []
    if not os.path.exists(default_model_path()):
        missing.append("the default model (scripts/fetch_model.sh)")
    if chromium is None:
        missing.append("chromium (scripts/setup.sh --test)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        missing.append("websocket-client (scripts/setup.sh --test)")
    if missing:
        print(("FAIL" if ci else "SKIP") + ": missing " + ", ".join(missing))
        return 1 if ci else 77

    question = "What is the capital of France?"
    with WeftServer(a.weft, ["--api-key", "k3y"]) as srv:
        st, page = srv.request("GET", "/")
        check(st == 200 and "<title>weft chat</title>" in page and "http" not in
              page.split("<script>")[0].split("<style>")[0].replace("http-equiv", ""),
              "GET / serves the page (no external resources)")
        b = Browser(chromium, srv.url + "/")
        try:
            check(b.wait_for("document.readyState === 'complete'", 60), "the page loads")
            # Without the key the server refuses, and the page says so.
            type_and_send(b, question)
            state = b.wait_for("(() => { const m = document.querySelectorAll('.msg');"
                               " const x = m[m.length - 1]; return x && x.dataset.state !== "
                               "'streaming' && x.dataset.state; })()")
            err = b.js("document.querySelector('.msg.error')?.textContent || ''")
            check(state == "error" and "API key" in err, f"a missing key shows the 401 in the page: {err!r}")
            # With the key, temperature 0 and a cap: the streamed answer.
            b.js("""(() => { document.getElementById('clear').click();
                document.getElementById('key').value = 'k3y';
                document.getElementById('temperature').value = '0';
                document.getElementById('max_tokens').value = '24'; return true; })()""")
            type_and_send(b, question)
            state = b.wait_for("(() => { const x = document.querySelector('.msg.assistant');"
                               " return x && x.dataset.state !== 'streaming' && x.dataset.state; })()")
            shown = b.js("document.querySelector('.msg.assistant')?.textContent || ''")
            check(state == "done" and len(shown) > 0, f"the answer streams into the page: {shown!r}")
            st, body = srv.request("POST", "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": question}],
                                    "temperature": 0, "max_tokens": 24, "top_p": 1},
                                   headers={"Authorization": "Bearer k3y"})
            want = json.loads(body)["choices"][0]["message"]["content"] if st == 200 else None
            check(shown == want, f"the page shows what the API answers (greedy): {want!r}")
            meta = b.js("Array.from(document.querySelectorAll('.meta'))"
                        ".map(x => x.textContent).join(' | ')")
            check("tokens in" in meta, f"the page reports tokens and time ({meta})")
            # A follow-up keeps the conversation (the request carries both turns).
            type_and_send(b, "And of Italy?")
            b.wait_for("(() => { const m = document.querySelectorAll('.msg.assistant');"
                       " return m.length === 2 && m[1].dataset.state === 'done'; })()")
            turns = b.js("document.querySelectorAll('.msg.user').length")
            check(turns == 2, "a second message continues the conversation")
            rows = b.wait_for("(() => { const r = document.querySelectorAll('#workers tbody tr');"
                              " return r.length && r[0].textContent; })()", 30)
            check(rows and "worker-0" in rows, f"the cluster panel lists the worker: {rows!r}")
        finally:
            b.close()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
