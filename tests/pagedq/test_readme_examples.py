"""The README's walkthroughs run as written."""

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.services import free_port, wait_for

README = Path(__file__).resolve().parents[2] / "README.md"


def code_block(section: str, language: str) -> str:
    text = README.read_text()
    start = text.index(section)
    return re.search(rf"```{language}\n(.*?)```", text[start:], re.S).group(1)


@pytest.mark.fast
def test_the_webhook_receiver_prints_each_event() -> None:
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-c", code_block("### Trying webhooks on one machine", "python"), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/hook"
        event = '{"object": "event", "type": "job.succeeded"}'

        def delivered() -> bool:
            try:
                return httpx.post(url, content=event, headers={"webhook-id": "msg_1"}).status_code == 204
            except httpx.ConnectError:
                return False

        wait_for(delivered, timeout=10, what="the README's receiver answering 204")
        receiver.terminate()
        assert f"msg_1 {event}" in receiver.communicate(timeout=10)[0]
    finally:
        receiver.kill()
