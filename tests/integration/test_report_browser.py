"""report.html in a real browser: headless Chromium through Selenium opens the page a run writes and checks
what an operator sees (no console error, the failed node's cells in the failure colour, one bar per node with
its node's name and value written beside it, the filter box), then saves a screenshot as a test artefact
(results/test-artefacts/report.png).

scripts/test installs Chromium and its driver (Debian's chromium, chromium-driver) when run as root; the test
installs them itself when root and they are missing, and skips only when that is impossible."""

import os
import shutil
import subprocess

import pytest

from cluster_preflight.outputs import history, report
from report_helpers import synthetic_verdict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTEFACTS = os.path.join(ROOT, "results", "test-artefacts")
FAIL_COLOUR = "rgba(207, 34, 46, 1)"
PACKAGES = ("chromium", "chromium-driver")


def _browser_paths():
    return shutil.which("chromium"), shutil.which("chromedriver")


def _install():
    """Chromium and its driver from the distribution when root and missing; why not, or None."""
    if all(_browser_paths()):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium and chromedriver are not installed and this user cannot install them (apt-get install %s " \
               "as root, or run scripts/test as root)" % " ".join(PACKAGES)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300, check=False)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + list(PACKAGES), env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if not all(_browser_paths()):
        return "chromium could not be installed: apt-get exited %d: %s" % (done.returncode, done.stderr[-500:])
    return None


@pytest.fixture(scope="module")
def driver():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-test.txt)")
    why = _install()
    if why:
        pytest.skip(why)
    chromium, chromedriver = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The distribution's driver, named: Selenium Manager would otherwise try to download one.
    browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A run directory with report.html of 12 nodes (node0003 fails, node0007 warns), after 3 recorded runs."""
    base = tmp_path_factory.mktemp("report")
    db = str(base / "history.sqlite")
    for number in range(1, 4):
        verdict = synthetic_verdict(12, failed=("node0003",) if number != 2 else (), warned=("node0007",),
                                    run_id="r%d" % number, finished="2026-11-0%dT00:00:00Z" % number, localize=True)
        history.record(db, verdict, "preflight", "x")
    run_dir = base / "r3"
    run_dir.mkdir()
    return verdict, report.write_report(verdict, str(run_dir), db)


def test_report_in_headless_chromium(driver, page):
    from selenium.webdriver.common.by import By  # pylint: disable=import-outside-toplevel

    verdict, path = page
    driver.get("file://" + path)
    assert driver.title.startswith("Preflight gate FAIL")
    errors = [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
    assert errors == []
    rows = driver.find_elements(By.CSS_SELECTOR, "tr.node-row")
    assert rows[0].get_attribute("data-node") == "node0003" and len(rows) == len(verdict["hosts"])
    failed = driver.find_elements(By.CSS_SELECTOR, 'tr[data-node="node0003"] td.cell.status-fail')
    assert failed, "the failed node has no failed cell"
    for cell in failed:
        assert cell.value_of_css_property("background-color") == FAIL_COLOUR
    status = driver.find_element(By.CSS_SELECTOR, 'tr[data-node="node0003"] td.status-fail')
    assert status.value_of_css_property("background-color") == FAIL_COLOUR
    passing = driver.find_element(By.CSS_SELECTOR, 'tr[data-node="node0000"] td.status-pass')
    assert passing.value_of_css_property("background-color") != FAIL_COLOUR
    bars = driver.find_elements(By.CSS_SELECTOR, "#busbw-nodes rect.bar")
    assert len(bars) == len(verdict["hosts"])
    assert all(bar.size["height"] > 0 and bar.size["width"] > 0 for bar in bars)
    # Every bar's node and value are written on the page, left and right of it: a screenshot shows them.
    labels = driver.find_elements(By.CSS_SELECTOR, "#busbw-nodes text.bar-label")
    values = driver.find_elements(By.CSS_SELECTOR, "#busbw-nodes text.bar-value")
    assert [label.text for label in labels] == verdict["hosts"]
    assert [value.text for value in values] == ["%.3f GB/s" % (10 + index / 10.0)
                                                for index in range(len(verdict["hosts"]))]
    chart = driver.find_element(By.ID, "busbw-nodes")
    for label, bar, value in zip(labels, bars, values):
        assert label.is_displayed() and value.is_displayed()
        # Inside the chart, not cut at its edges.
        assert label.location["x"] >= chart.location["x"]
        assert value.location["x"] + value.size["width"] <= chart.location["x"] + chart.size["width"] + 1
        assert label.size["width"] > 0 and value.size["width"] > 0
        assert label.location["x"] + label.size["width"] <= bar.location["x"] + 1
        assert value.location["x"] >= bar.location["x"] + bar.size["width"] - 1
        assert abs((label.location["y"] + label.size["height"] / 2) - (bar.location["y"] + bar.size["height"] / 2)) < 6
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg.spark")) == len(verdict["hosts"])
    os.makedirs(ARTEFACTS, exist_ok=True)
    shot = os.path.join(ARTEFACTS, "report.png")
    assert driver.save_screenshot(shot) and os.path.getsize(shot) > 0
    print("report screenshot: %s" % shot)
    box = driver.find_element(By.ID, "filter")
    box.send_keys("fail")
    shown = [row.get_attribute("data-node") for row in driver.find_elements(By.CSS_SELECTOR, "tr.node-row")
             if row.is_displayed()]
    assert shown == ["node0003"]
    assert [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"] == []
