"""The web chat at / in a real headless browser (Debian's Chromium through its WebDriver): send a
message, read the streamed reply and its colours from the page, stop a long reply."""
from __future__ import annotations

import json
import os
import shutil
import time

import openai
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cospec_local.server.process import ServerProcess

BEADS = ("Omar has 23 beads. Then Omar buys 32 more beads. Omar loses 21 of the beads. Omar gives 24 beads to "
         "Pablo. How many beads does Omar have now?")
GREEN, MAGENTA = "rgba(26, 127, 55, 1)", "rgba(176, 16, 158, 1)"  # chat --color's green and magenta


def chromium():
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        pytest.fail("the web chat test needs Chromium and its WebDriver: apt-get install chromium chromium-driver "
                    "(./install.sh --dev does it as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,760"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("-c", "512")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def send(browser, text: str) -> None:
    box = browser.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()


@pytest.mark.slow
def test_the_page_streams_a_reply_coloured_by_provenance(server, browser, tmp_path):
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#arbiter option"))
    # The demo pair knows only its tasks: the page says so before anyone asks it "who are you?".
    about = browser.find_element(By.ID, "about")
    assert about.is_displayed() and "arithmetic word problems" in about.text and "smollm2-135m" in about.text
    temperature = browser.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("0")
    send(browser, BEADS)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".stats"))
    reply = browser.find_element(By.CSS_SELECTOR, ".msg.assistant")
    stats = browser.find_element(By.CSS_SELECTOR, ".stats").text

    # The same request through the API: the page shows exactly its text and its provenance.
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
    api = client.chat.completions.create(model="demo-target", messages=[{"role": "user", "content": BEADS}],
                                         temperature=0, max_tokens=512, extra_body={"provenance": True})
    assert reply.text == api.choices[0].message.content.strip() != ""
    tokens = [t for t in api.model_extra["cospec"]["tokens"] if t["text"]]
    spans = reply.find_elements(By.CSS_SELECTOR, "span.tok")
    assert [s.get_attribute("class").split()[1] for s in spans] == [t["provenance"] for t in tokens]
    kept = reply.find_elements(By.CSS_SELECTOR, "span.tok.kept")
    matched = reply.find_elements(By.CSS_SELECTOR, "span.tok.match")
    assert kept and matched, "the demo pair's arbiter keeps draft tokens in this reply"
    assert {s.value_of_css_property("color") for s in kept} == {MAGENTA}
    assert {s.value_of_css_property("color") for s in matched} == {GREEN}
    assert "tok/s" in stats and f"arbiter keeps {api.model_extra['timings']['arbiter_keeps']}" in stats
    browser.save_screenshot(os.environ.get("COSPEC_WEB_CHAT_SCREENSHOT", str(tmp_path / "web-chat.png")))


@pytest.mark.slow
def test_the_stop_button_ends_a_reply_and_the_chat_goes_on(target_path, draft_paths, browser):
    """SmolLM2 writes long replies (seconds here): Stop ends one mid-way, the server's engine is free
    again at once, and the next message gets its reply."""
    srv = ServerProcess("-m", target_path, "-md", draft_paths["disagreeing"], "-a", "smollm2", "-c", "2048")
    try:
        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#mode option"))
        browser.execute_script("document.getElementById('max-tokens').value = 1500")
        send(browser, "Tell me a very long story about a dragon who learns to bake bread.")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant span.tok"))
        browser.find_element(By.ID, "stop").click()
        wait.until(lambda b: b.find_element(By.ID, "send").is_enabled())
        assert browser.find_element(By.CSS_SELECTOR, ".stats").text == "[stopped]"
        assert json.loads(srv.get("/health")[1])["engines_busy"] == 0 or _idle_soon(srv)
        # The server draws a fresh seed per request: at 1,500 tokens a rambling reply (about 50 tok/s
        # here) could outlast the wait. The chat going on is the point, not the reply's length.
        browser.execute_script("document.getElementById('max-tokens').value = 64")
        send(browser, "Say hello.")
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".stats")) == 2
                   and not b.find_element(By.ID, "stop").is_enabled())
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].text
        assert "tok/s" in browser.find_elements(By.CSS_SELECTOR, ".stats")[1].text
        assert not browser.find_elements(By.CSS_SELECTOR, ".msg.error")
    finally:
        srv.stop()


def _idle_soon(srv, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if json.loads(srv.get("/health")[1])["engines_busy"] == 0:
            return True
        time.sleep(0.05)
    return False
