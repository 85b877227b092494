"""The page at / in a real headless browser (Debian's chromium and chromium-driver, through
Selenium): type a sentence, wait for the translation, switch site, layer and head, and read the
drawn cells' weights back against the API's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_checkpoint
from test_serve import Server

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)
SENTENCE = "a big dog runs over the small ball"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("model"), steps=20)
    started = Server(f"ckpt_path={checkpoint}")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    yield driver
    driver.quit()


def drawn(browser) -> np.ndarray:
    cells = browser.find_elements(By.CSS_SELECTOR, "#heatmap tbody td")
    rows = 1 + max(int(c.get_attribute("data-row")) for c in cells)
    return np.array([float(c.get_attribute("data-weight")) for c in cells]).reshape(rows, -1)


def test_the_page_translates_and_draws_the_apis_weights(server: Server, browser) -> None:
    answer = server.post({"sentences": [SENTENCE], "attention": True}).json()
    maps = {(m["site"], m["layer"]): m for m in answer["attention"][0]["maps"]}

    browser.get(server.url)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    source = browser.find_element(By.ID, "source")
    source.clear()
    source.send_keys(SENTENCE)
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-translated"))
    assert browser.find_element(By.ID, "translation").text == answer["translations"][0][0]["text"]

    for site, layer, head in [
        ("encoder_self", 1, "2"),
        ("decoder_self", 0, "1"),
        ("cross", 1, "3"),
    ]:
        Select(browser.find_element(By.ID, "site")).select_by_value(site)
        Select(browser.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(browser.find_element(By.ID, "head")).select_by_value(head)
        expected = np.array(maps[site, layer]["weights"][int(head)])
        np.testing.assert_array_equal(drawn(browser), expected)
    Select(browser.find_element(By.ID, "head")).select_by_value("mean")
    mean = np.array(maps["cross", 1]["weights"]).mean(axis=0)
    np.testing.assert_allclose(drawn(browser), mean, atol=1e-9)

    cell = browser.find_element(By.CSS_SELECTOR, "#heatmap tbody tr:nth-child(2) td")
    webdriver.ActionChains(browser).move_to_element(cell).perform()
    assert browser.find_element(By.ID, "hover").text == cell.get_attribute("title")

    browser.find_element(By.CSS_SELECTOR, "input[name=view][value=all]").click()
    heads = len(maps["cross", 0]["weights"])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid canvas")) == 2 * heads
    assert "K/V from source" in browser.find_element(By.ID, "summary").text


def test_a_bad_request_shows_its_error(server: Server, browser) -> None:
    browser.get(server.url)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    beam = browser.find_element(By.ID, "beam")
    beam.clear()
    beam.send_keys("2")
    nbest = browser.find_element(By.ID, "nbest")
    nbest.clear()
    nbest.send_keys("3")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text)
    assert "3 hypotheses from a beam of 2" in browser.find_element(By.ID, "status").text


def test_the_page_loads_nothing_from_elsewhere() -> None:
    static = Path(__file__).resolve().parents[1] / "seq2seq" / "serving" / "static"
    for path in static.iterdir():
        text = path.read_text()
        assert "http://" not in text and "https://" not in text, path
