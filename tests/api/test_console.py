"""The web console (``/console``) in a real browser (Debian's Chromium, driven by Playwright) against one
real ``pagedq up``, and the JSON routes it reads (``/v1/overview``, a batch's latency histograms)."""

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from core import keys
from core.db import make_db_engine, make_sessionmaker
from core.models import Batch, utcnow
from core.settings import Settings
from tests.pagedq.test_embedded import start_up
from tests.support.services import free_port
from tests.support.tiny_models import make_tiny_model

CHROMIUM = Path("/usr/bin/chromium")
XSS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']


def run_up(tmp: Path, **settings: object) -> tuple[object, httpx.Client]:
    model = make_tiny_model(tmp / "model", "llama", max_position_embeddings=16384)  # room for a long job
    quick = {"shutdown_grace": 0.2, "flush_interval": 0.1, "heartbeat_interval": 0.5}
    common = {"data_dir": tmp / "data", "model": str(model), "port": free_port(), "device": "cpu"}
    admin = str(settings.get("admin_key", ""))
    return start_up(Settings(**common, kv_cache_bytes=64 * 2**20, **quick, **settings), tmp / "up.log", admin)


@pytest.fixture(scope="module")
def console_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console")


@pytest.fixture(scope="module")
def up(console_dir: Path) -> Iterator[httpx.Client]:
    process, client = run_up(console_dir)
    try:
        yield client
    finally:
        assert process.stop() == 0, process.log()[-3000:]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("the console's browser tests need /usr/bin/chromium (make test-setup installs it)")
        pytest.skip("no /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, up: httpx.Client, errors: list[str], refused: str = "") -> object:
    """A page of a new context (its own sessionStorage); ``errors`` collects its script errors, and
    console errors but those of responses with status ``refused`` (a 403 or 404 the test expects)."""
    context = browser.new_context(base_url=str(up.base_url), viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: errors.append(str(error)))
    expected = f"status of {refused}" if refused else None
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            and not (expected and expected in message.text)
            and errors.append(message.text)
        ),
    )
    page.set_default_timeout(20_000)
    return page


@pytest.fixture
def page(browser, up: httpx.Client) -> Iterator[object]:
    errors: list[str] = []
    page = open_page(browser, up, errors)
    yield page
    page.context.close()
    assert errors == []


def submit(up: httpx.Client, body: dict[str, object], wait: bool = True) -> dict[str, object]:
    headers = {"Prefer": "wait=60"} if wait else {}
    job = up.post("/v1/jobs", json=body, headers=headers).json()
    assert "id" in job, job
    return job


def test_overview_sees_a_submitted_job_appear_and_finish(page, up: httpx.Client) -> None:
    page.goto("/console")
    assert page.url.endswith("/console/")
    count = page.locator("[data-count=succeeded] b")
    before = int(count.inner_text())
    assert page.locator("table.workers tr").count() == 2  # the live worker's row under the header
    job = submit(up, {"prompt": "hello", "max_tokens": 4, "metadata": {"from": "console-test"}}, wait=False)
    succeeded = "document.querySelector('[data-count=succeeded] b').textContent"
    page.wait_for_function(f"{succeeded} == '{before + 1}'")
    # this minute's tokens per second, or the last minute's if the job ended as the minute turned
    assert page.evaluate("Math.max(...pagedq.charts.throughput.data[1].slice(-2))") > 0
    (model,) = up.get("/v1/models").json()["data"]
    row = page.locator(f"table.models tr[data-model='{model['id']}']")
    assert row.locator("td").all_inner_texts()[1:5] == [
        "generate",
        "0",
        "0",
        "1",
    ]  # kind, queued, broker, workers
    row.locator("a").click()  # the model's jobs
    page.wait_for_selector(f"tr[data-job='{job['id']}']")

    page.goto("/console/#/jobs?metadata=from%3Dconsole-test")
    row = page.locator(f"tr[data-job='{job['id']}']")
    assert "succeeded" in row.inner_text()


def test_job_page_timeline_has_one_point_per_token(page, up: httpx.Client) -> None:
    job = submit(up, {"prompt": "count", "max_tokens": 40, "ignore_eos": True})
    assert job["status"] == "succeeded"
    times = job["timings"]["token_times_ms"]
    page.goto(f"/console/#/job/{job['id']}")
    page.wait_for_function("pagedq.charts.timeline !== undefined")
    index, gaps, ttft = page.evaluate("pagedq.charts.timeline.data")
    assert index == list(range(40)) and len(gaps) == len(ttft) == 40
    assert ttft[0] == times[0] and ttft[1:] == [None] * 39  # the first token's point is the TTFT
    assert gaps[0] is None and gaps[5] == pytest.approx(times[5] - times[4])
    assert page.locator(".phases").get_attribute("data-phases") == "queue prefill decode"
    assert page.locator("pre[data-choice='0']").text_content() == job["output"]


def test_cancel_button_stops_a_running_job(page, up: httpx.Client) -> None:
    job = submit(up, {"prompt": "go on", "max_tokens": 16000, "ignore_eos": True}, wait=False)
    page.goto(f"/console/#/job/{job['id']}")
    page.wait_for_function("document.querySelector('h2 .status')?.textContent === 'running'")
    page.wait_for_function("document.querySelector(\"pre[data-choice='0']\")?.textContent.length > 0")  # live
    page.click("#cancel")
    page.wait_for_function("document.querySelector('h2 .status')?.textContent === 'cancelled'")
    final = up.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "cancelled" and 0 < final["usage"]["completion_tokens"] < 16000


def test_batch_page_progress_reaches_100_percent(page, up: httpx.Client) -> None:
    body = {"prompt": "n", "max_tokens": 3}
    line = {"method": "POST", "url": "/v1/completions", "body": body}
    lines = [{"custom_id": f"r{i}"} | line for i in range(4)]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = {"file": ("in.jsonl", io.BytesIO(content))}
    file = up.post("/v1/files", files=upload, data={"purpose": "batch"}).json()
    create = {"input_file_id": file["id"], "endpoint": "/v1/completions", "completion_window": "1h"}
    batch = up.post("/v1/batches", json=create).json()
    page.goto(f"/console/#/batch/{batch['id']}")
    page.wait_for_function("document.querySelector('#progress')?.dataset.percent === '100.0'")
    page.wait_for_function("document.querySelector('h2 .status')?.textContent === 'completed'")
    assert page.locator("table.jobs tr[data-job]").count() == 4
    assert page.locator("a.download").count() == 2  # the input and output files

    latency = up.get(f"/v1/batches/{batch['id']}/latency").json()
    assert latency["jobs"] == 4 and sum(latency["e2e_latency"]["counts"]) == 4


def test_a_batch_at_risk_of_missing_its_window_shows_a_badge(
    page, up: httpx.Client, console_dir: Path
) -> None:
    body = {"prompt": "go on", "max_tokens": 16000, "ignore_eos": True}  # in progress while the page looks
    line = {"method": "POST", "url": "/v1/completions", "body": body}
    content = "".join(json.dumps({"custom_id": f"r{i}"} | line) + "\n" for i in range(2)).encode()
    file = up.post(
        "/v1/files", files={"file": ("in.jsonl", io.BytesIO(content))}, data={"purpose": "batch"}
    ).json()
    create = {"input_file_id": file["id"], "endpoint": "/v1/completions", "completion_window": "1h"}
    batch = up.post("/v1/batches", json=create).json()
    # What the reconciler's estimate sets once the measured rate says the batch will miss its window
    # (worker/estimates.py, tested against PostgreSQL in tests/worker/test_estimates.py).
    engine = make_db_engine(Settings(data_dir=console_dir / "data"))
    with make_sessionmaker(engine).begin() as session:
        session.execute(update(Batch).where(Batch.id == batch["id"]).values(at_risk_at=utcnow()))
    engine.dispose()
    try:
        assert up.get(f"/v1/batches/{batch['id']}").json()["at_risk"] is True
        page.goto(f"/console/#/batch/{batch['id']}")
        page.wait_for_selector("h2 .badge.at-risk")
        page.goto("/console/#/batches")
        page.wait_for_selector(f"tr:has(a[href='#/batch/{batch['id']}']) .badge.at-risk")
    finally:
        assert up.post(f"/v1/batches/{batch['id']}/cancel").status_code == 200


def test_what_users_wrote_stays_text(page, up: httpx.Client) -> None:
    for prompt in XSS:
        job = submit(up, {"prompt": prompt, "max_tokens": 2, "metadata": {"note": prompt}})
        page.goto(f"/console/#/job/{job['id']}")
        assert page.locator("pre.prompt").text_content() == prompt
        page.wait_for_function("pagedq.charts.timeline !== undefined")
        assert prompt in page.locator("main dl").inner_text()  # the metadata, as text
        page.goto("/console/#/jobs")
        page.wait_for_selector(f"tr[data-job='{job['id']}']")
        assert page.locator("main script, main img").count() == 0
    assert page.dialogs == []


def test_state_changes_from_another_site_are_refused(up: httpx.Client) -> None:
    job = submit(up, {"prompt": "x", "max_tokens": 1})
    cancel = f"/v1/jobs/{job['id']}/cancel"
    assert up.post(cancel, headers={"Origin": "http://evil.example"}).status_code == 403
    assert up.post(cancel, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert up.post(cancel, headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
    own = f"http://{up.base_url.netloc.decode()}"
    same = {"Origin": own, "Sec-Fetch-Site": "same-origin"}
    assert up.post(cancel, headers=same).status_code == 409  # allowed, and the job has ended
    assert up.post(cancel).status_code == 409  # a client that is no browser sends neither header
    assert up.get(f"/v1/jobs/{job['id']}", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


def test_overview_reports_counts_queue_workers_and_the_last_hour(up: httpx.Client) -> None:
    submit(up, {"prompt": "y", "max_tokens": 5})
    overview = up.get("/v1/overview").json()
    assert overview["jobs"]["succeeded"] >= 1 and set(overview["jobs"]) >= {"queued", "running", "failed"}
    assert overview["queue_depth"] == 0 and overview["oldest_queued_age_s"] is None
    (worker,) = overview["workers"]
    (model,) = overview["models"]
    assert (model["name"], model["kind"], model["queued"], model["queue_depth"]) == (
        worker["model"],
        "generate",
        0,
        0,
    )
    assert model["live_workers"] == 1 and model["tokens_per_s"] > 0
    assert {"num_running", "num_waiting", "kv_cache_usage"} <= set(worker["stats"])
    minutes = overview["last_hour"]
    assert len(minutes) == 60
    # the job's minute: this one, or the last if the minute turned since the job ended
    (minute,) = [m for m in minutes[-2:] if m["jobs"] >= 1][-1:]
    assert minute["tokens_per_s"] > 0 and minute["median_ttft_ms"] > 0


def test_with_auth_required_a_user_key_sees_its_own_jobs_and_an_admin_filters_by_key(
    browser, tmp_path: Path
) -> None:
    admin = keys.new_key()
    process, up = run_up(tmp_path, auth="required", admin_key=admin)
    try:
        ann, bob = (up.post("/v1/admin/keys", json={"name": name}).json()["key"] for name in ("ann", "bob"))
        body = {"prompt": "hi", "max_tokens": 2}
        wait = {"Prefer": "wait=60"}
        mine, theirs = (
            up.post("/v1/jobs", json=body, headers=wait | {"Authorization": f"Bearer {key}"}).json()["id"]
            for key in (ann, bob)
        )
        errors: list[str] = []
        page = open_page(browser, up, errors, refused="40")  # bob's job is a 404, ann's admin list a 403
        page.goto("/console/#/jobs")
        page.fill("input[type=password]", ann)  # the 401 asked for a key
        page.click("text=Use key")
        page.wait_for_selector(f"tr[data-job='{mine}']")
        assert page.locator("tr[data-job]").count() == 1  # not bob's
        assert page.locator("select[name=key]").is_hidden()  # no key filter for a user key
        page.goto(f"/console/#/job/{theirs}")
        page.wait_for_selector("p.error")
        assert "not found" in page.locator("p.error").inner_text()
        text, url = page.locator("body").inner_text(), page.url
        assert ann not in text and ann not in url and bob not in text
        page.context.close()

        page = open_page(browser, up, errors, refused="40")
        page.goto("/console/#/jobs")
        page.fill("input[type=password]", admin)
        page.click("text=Use key")
        page.wait_for_selector(f"tr[data-job='{mine}']")
        page.wait_for_selector(f"tr[data-job='{theirs}']")
        assert page.locator(f"tr[data-job='{theirs}'] td.key").inner_text() == "bob"
        page.select_option("select[name=key]", "ann")
        page.click("text=Filter")
        page.wait_for_function(f"!document.querySelector(\"tr[data-job='{theirs}']\")")
        page.wait_for_selector(f"tr[data-job='{mine}']")  # the filtered list, drawn
        assert page.locator("tr[data-job]").count() == 1 and "key=ann" in page.url
        text = page.locator("body").inner_text()
        assert all(key not in text and key not in page.url for key in (admin, ann, bob))
        page.context.close()
        assert errors == []
    finally:
        assert process.stop() == 0, process.log()[-3000:]
