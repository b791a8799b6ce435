"""Takes the README's console screenshots (docs/console-*.png) from a running pagedq.

    pagedq up &   # or `make run`
    python docs/console_screenshots.py http://127.0.0.1:8000 [JOB_ID]

Submits a few jobs, one of 256 tokens (or takes JOB_ID's), then shoots the overview and that job's page in
Debian's Chromium.
"""

import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

DOCS = Path(__file__).parent
PROMPTS = ["Write a short poem about the sea.", "Explain what a KV cache is.", "List three uses of Redis."]


def main(base: str, job_id: str | None) -> None:
    api = httpx.Client(base_url=base, timeout=300)
    job = {"id": job_id} if job_id else submit(api)
    while api.get(f"/v1/jobs/{job['id']}").json()["status"] in ("queued", "running"):
        time.sleep(2)
    shoot(base, job["id"])


def submit(api: httpx.Client) -> dict[str, str]:
    for prompt in PROMPTS:
        api.post("/v1/jobs", json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 64})
    story = {"role": "user", "content": "Tell a long story about a lighthouse keeper."}
    body = {"messages": [story], "max_tokens": 256, "ignore_eos": True, "metadata": {"user": "ann"}}
    return api.post("/v1/jobs", json=body).json()


def shoot(base: str, job_id: str) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/console/")
        page.wait_for_function("window.pagedq.charts.ttft !== undefined")
        page.screenshot(path=DOCS / "console-overview.png", full_page=True)
        page.goto(f"{base}/console/#/job/{job_id}")
        page.wait_for_function("window.pagedq.charts.timeline !== undefined")
        page.wait_for_timeout(500)
        page.screenshot(path=DOCS / "console-job.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "http://127.0.0.1:8000", args[1] if len(args) > 1 else None)
