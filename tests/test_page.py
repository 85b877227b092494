"""The page at / in a real headless browser (Debian's chromium and chromium-driver, through
Selenium): type a sentence, wait for the translation, switch site, layer and head, and read the
drawn cells' weights back against the API's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_config, multilingual_overrides, tiny_checkpoint, write_aligned
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
    # the last decoder layer's cross-attention swapped: source queries over the target,
    # one map per target prefix
    swapped = "model.attention.layers=[{layers: last:1, cross: {query: source, key_value: target}}]"
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("model"), 20, swapped)
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
    """The drawn map's cells, each its `data-weight`, read in one call (not one per cell)."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#heatmap tbody tr')].map("
        "row => [...row.querySelectorAll('td')].map(cell => cell.dataset.weight))"
    )
    return np.array([[float(w) for w in row] for row in rows])


@pytest.mark.slow
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

    for site, layer, head in [  # transformer_tiny: 2 + 2 layers, 2 heads
        ("encoder_self", 1, "1"),
        ("decoder_self", 0, "0"),
        ("cross", 0, "1"),
        ("cross", 1, "1"),
    ]:
        Select(browser.find_element(By.ID, "site")).select_by_value(site)
        Select(browser.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(browser.find_element(By.ID, "head")).select_by_value(head)
        expected = np.array(maps[site, layer]["weights"][int(head)])
        if maps[site, layer]["per_prefix"]:
            expected = expected[-1]  # the whole target's prefix, shown first
        np.testing.assert_array_equal(drawn(browser), expected)
    assert not maps["cross", 0]["per_prefix"] and maps["cross", 1]["per_prefix"]
    axes = browser.find_element(By.ID, "axes").text
    assert "queries from the source" in axes and "keys/values from the target" in axes
    last = len(answer["attention"][0]["target"]) - 1
    np.testing.assert_array_equal(drawn(browser), np.array(maps["cross", 1]["weights"][1][last]))
    Select(browser.find_element(By.ID, "step")).select_by_value("1")  # the prefix <s> x1
    np.testing.assert_array_equal(drawn(browser), np.array(maps["cross", 1]["weights"][1][1]))
    Select(browser.find_element(By.ID, "head")).select_by_value("mean")
    mean = np.array(maps["cross", 1]["weights"])[:, 1].mean(axis=0)
    np.testing.assert_allclose(drawn(browser), mean, atol=1e-9)
    Select(browser.find_element(By.ID, "layer")).select_by_value("0")
    assert not browser.find_element(By.ID, "step-label").is_displayed()

    cell = browser.find_element(By.CSS_SELECTOR, "#heatmap tbody tr:nth-child(2) td")
    webdriver.ActionChains(browser).move_to_element(cell).perform()
    assert browser.find_element(By.ID, "hover").text == cell.get_attribute("title")

    browser.find_element(By.CSS_SELECTOR, "input[name=view][value=all]").click()
    heads = len(maps["cross", 0]["weights"])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid canvas")) == 2 * heads
    assert "K/V from source" in browser.find_element(By.ID, "summary").text


@pytest.mark.slow
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


@pytest.fixture(scope="module")
def multilingual_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A tiny en->xx, en->yy model (the toy languages of tests/helpers.py) served."""
    from seq2seq.training.run import train

    work = tmp_path_factory.mktemp("multilingual")
    settings = [
        *multilingual_overrides(write_aligned(work / "aligned"), work / "cache"),
        "model=transformer_tiny",
        "data.max_tokens=256",
        "trainer.max_epochs=10",
        "trainer.num_sanity_val_steps=0",
        "decoding=greedy",
        "average_last=0",
        "evaluate_after=false",
    ]
    checkpoint = train(compose_config(settings), work / "run")["final_checkpoint"]
    started = Server(f"ckpt_path={checkpoint}", "decoding.target_lang=yy")
    yield started
    started.stop()


@pytest.mark.slow
def test_the_page_offers_the_models_languages_and_translates_into_the_one_chosen(
    multilingual_server: Server, browser
) -> None:
    browser.get(multilingual_server.url)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    beam = int(browser.find_element(By.ID, "beam").get_attribute("value"))

    def api(lang: str) -> str:  # asked as the page asks
        body = {"sentences": [SENTENCE], "decoding": {"target_lang": lang, "beam_size": beam}}
        return multilingual_server.post(body).json()["translations"][0][0]["text"]

    target = Select(browser.find_element(By.ID, "target"))
    assert [o.get_attribute("value") for o in target.options] == ["xx", "yy"]
    assert target.first_selected_option.get_attribute("value") == "yy"  # the server's default
    source = browser.find_element(By.ID, "source")
    source.clear()
    source.send_keys(SENTENCE)
    for count, lang in enumerate(["yy", "xx"], 1):
        target.select_by_value(lang)
        browser.find_element(By.ID, "translate").click()
        wait.until(
            lambda b, n=count: (
                b.find_element(By.TAG_NAME, "body").get_attribute("data-translated") == str(n)
            )
        )
        assert browser.find_element(By.ID, "translation").text == api(lang)
    assert api("xx") != api("yy")


def test_the_page_loads_nothing_from_elsewhere() -> None:
    static = Path(__file__).resolve().parents[1] / "seq2seq" / "serving" / "static"
    for path in static.iterdir():
        text = path.read_text()
        assert "http://" not in text and "https://" not in text, path
