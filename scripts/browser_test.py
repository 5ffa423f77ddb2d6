#!/usr/bin/env python3
"""Browser test of the web page served by `craterdex serve`, in headless Chromium.

Starts the server on a free loopback port, opens the page, uploads a gallery image through
the file chooser, checks the rendered results (count, the image itself ranked first, crater
id, scores, loaded thumbnails), clicks another result to search with it, then stops the
server with SIGTERM and checks that it shuts down cleanly.

Needs: Playwright for Python (pip install playwright) and a Chromium binary (Debian's
`chromium`; no browser download). Usage:
  python3 scripts/browser_test.py --bin target/release/craterdex --index IDX [--image IMG.png]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/ready", timeout=2) as r:
                if json.load(r).get("ready"):
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit("server did not become ready")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--image", help="an image of the index's gallery (default: its first image)")
    ap.add_argument("--model")
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser"))
    a = ap.parse_args()
    if not a.chromium:
        sys.exit("no chromium binary found (apt-get install chromium, or set CHROMIUM)")

    if not a.image:
        import glob
        seg = sorted(glob.glob(os.path.join(a.index, "seg-*", "meta.jsonl")))[0]
        a.image = json.loads(open(seg).readline())["path"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [a.bin, "serve", "--index", a.index, "--addr", f"127.0.0.1:{port}"]
    if a.model:
        cmd += ["--model", a.model]
    proc = subprocess.Popen(cmd)
    try:
        wait_ready(url, proc)
        expected_id = os.path.splitext(os.path.basename(a.image))[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.chromium, args=["--no-sandbox"])
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.goto(url + "/")
            page.wait_for_function("document.getElementById('stats').textContent.includes('images')")
            check("images" in page.inner_text("#stats"), "the header shows index statistics")

            page.set_input_files("#file", a.image)
            page.wait_for_selector("body[data-state=done]", timeout=60_000)
            cards = page.query_selector_all(".result")
            check(len(cards) == 10, f"10 results rendered (got {len(cards)})")
            first = cards[0]
            check(first.get_attribute("data-id") == expected_id,
                  f"the uploaded gallery image is ranked first ({first.get_attribute('data-id')})")
            check(first.inner_text().count("#1") == 1, "ranks are shown")
            score = float(first.query_selector(".f-stage2").inner_text())
            check(score > 0.95, f"its late-interaction score is ~1 ({score})")
            check(first.query_selector(".crater").inner_text().strip() != "", "crater id shown")
            page.wait_for_function(
                "[...document.querySelectorAll('.result img')].slice(0, 5)"
                ".every(i => i.complete && i.naturalWidth > 0)", timeout=30_000)
            check(True, "thumbnails of the top results loaded")

            second_id = cards[1].get_attribute("data-id")
            page.evaluate("document.body.dataset.state = 'clicked'")
            cards[1].click()
            page.wait_for_selector("body[data-state=done]", timeout=60_000)
            check(second_id in page.inner_text("#query-label"), "clicking a result searches with it")
            top = page.query_selector(".result").get_attribute("data-id")
            check(top == second_id, f"and ranks it first ({top})")
            check(not errors, f"no JavaScript errors ({errors})")
            if os.environ.get("SCREENSHOT"):
                page.screenshot(path=os.environ["SCREENSHOT"], full_page=True)
            browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
    check(rc == 0, f"SIGTERM shuts the server down cleanly (exit {rc})")
    print("browser test passed")


if __name__ == "__main__":
    main()
