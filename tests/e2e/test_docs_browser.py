"""``/v2/docs`` in a real browser: Debian's headless Chromium, driven by Selenium through Debian's ChromeDriver.

It loads the page from a real server, finds every endpoint of the OpenAPI document rendered (Swagger UI 4 rendered
none of an OpenAPI 3.1 document: "Unable to render this definition"), and runs one "Try it out" infer through the
page.  Skipped, with the reason, where Chromium, ChromeDriver or Selenium is missing (`make browser` installs the
first two as root; Selenium is in the test extra).  Nothing is downloaded: no Selenium Manager, no browser build.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fastoip
from fastoip.demo import write_repository

pytestmark = pytest.mark.timeout(180)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# this machine's network is closed: without the background-networking flags Chromium keeps trying Google's hosts
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,2000")
#: where the page's screenshot goes (for a person to look at); a temporary folder when unset
SCREENSHOT_DIR = os.environ.get("FASTOIP_SCREENSHOT_DIR")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(f"Chromium or ChromeDriver not installed ({CHROMIUM}, {CHROMEDRIVER}): `make browser` installs "
                "Debian's chromium and chromium-driver (as root)", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[fastoip.Server]:
    root = write_repository(tmp_path_factory.mktemp("docs") / "repository", ["simple"])
    with fastoip.Server(root, grpc=False) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="fastoip-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()


def documented_operations(server: fastoip.Server) -> set[tuple[str, str]]:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/docs/openapi.json", timeout=10) as answer:
        document = json.loads(answer.read())
    return {(method.upper(), path) for path, methods in document["paths"].items() for method in methods}


def rendered_operations(driver: Any) -> set[tuple[str, str]]:
    found = set()
    for block in driver.find_elements(By.CSS_SELECTOR, ".opblock"):
        method = block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.strip().upper()
        path = block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path")
        found.add((method, path))
    return found


def screenshot(driver: Any, name: str, tmp_path: Path) -> Path:
    folder = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    driver.save_screenshot(str(target))
    return target


def test_every_endpoint_renders(server: fastoip.Server, browser: Any, tmp_path: Path) -> None:
    expected = documented_operations(server)
    browser.get(f"http://{server.http_url}/v2/docs")
    try:
        WebDriverWait(browser, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(expected))
    except TimeoutException:
        shot = screenshot(browser, "docs-failed.png", tmp_path)
        errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper, .loading-container")]
        pytest.fail(f"the page rendered {len(browser.find_elements(By.CSS_SELECTOR, '.opblock'))} of "
                    f"{len(expected)} operations; page errors {errors}; screenshot {shot}")
    assert "Unable to render this definition" not in browser.page_source
    assert rendered_operations(browser) == expected
    assert len(expected) >= 39
    screenshot(browser, "docs.png", tmp_path)


def test_try_it_out_runs_an_infer(server: fastoip.Server, browser: Any, tmp_path: Path) -> None:
    browser.get(f"http://{server.http_url}/v2/docs")
    wait = WebDriverWait(browser, 30)
    block = wait.until(lambda d: next(
        (b for b in d.find_elements(By.CSS_SELECTOR, ".opblock-post")
         if b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path")
         == "/v2/models/{model_name}/infer"), False))
    block.find_element(By.CSS_SELECTOR, ".opblock-summary-control, .opblock-summary").click()
    wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, "button.try-out__btn"))[0].click()
    model_name = wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, "tr[data-param-name='model_name'] input"))
    model_name[0].send_keys("simple")
    request = {"id": "from-the-browser", "inputs": [
        {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for i in (0, 1)]}
    body = wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, "textarea.body-param__text"))[0]
    body.send_keys(Keys.CONTROL, "a")
    body.send_keys(Keys.DELETE)
    body.send_keys(json.dumps(request))
    block.find_element(By.CSS_SELECTOR, "button.execute").click()
    status = wait.until(
        lambda d: block.find_elements(By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_status"))
    shot = screenshot(browser, "docs-try-it-out.png", tmp_path)
    answer_text = block.find_element(By.CSS_SELECTOR, ".live-responses-table .response-col_description pre").text
    assert status[0].text.strip().startswith("200"), (status[0].text, answer_text, shot)
    answer = json.loads(answer_text)
    assert answer["id"] == "from-the-browser" and answer["model_name"] == "simple"
    outputs = {output["name"]: output["data"] for output in answer["outputs"]}
    assert outputs["OUTPUT0"] == [2 * i for i in range(16)] and outputs["OUTPUT1"] == [0] * 16
