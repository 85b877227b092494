"""README's picture of the page: a trained model served, one sentence translated, the chosen
site's map drawn, in Debian's headless Chromium. MODEL is what serve's ckpt_path takes: a run
directory (its final.ckpt), a checkpoint or an export directory.

    python scripts/screenshot.py MODEL [--sentence TEXT] [--site cross] [--layer N] [--head mean]
        [--output docs/img/serve_page.png]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait
from serve_benchmark import start_server

from seq2seq.io import atomic_path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--sentence", default="A man in a blue shirt is riding a bike.")
    parser.add_argument("--site", default="cross")
    parser.add_argument("--layer", type=int, default=3, help="0-based")
    parser.add_argument("--head", default="mean")
    parser.add_argument("--output", type=Path, default=Path("docs/img/serve_page.png"))
    args = parser.parse_args(argv)
    process, url = start_server(args.model)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--window-size=1500,1100"):
        options.add_argument(argument)
    service = webdriver.ChromeService(shutil.which("chromedriver"))
    browser = webdriver.Chrome(options=options, service=service)
    try:
        browser.get(url)
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        source = browser.find_element(By.ID, "source")
        source.clear()
        source.send_keys(args.sentence)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-translated"))
        Select(browser.find_element(By.ID, "site")).select_by_value(args.site)
        Select(browser.find_element(By.ID, "layer")).select_by_value(str(args.layer))
        Select(browser.find_element(By.ID, "head")).select_by_value(args.head)
        with atomic_path(args.output) as tmp:
            tmp.write_bytes(browser.get_screenshot_as_png())
    finally:
        browser.quit()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
