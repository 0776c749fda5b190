"""What a test run holds when it is stopped, for tests/integration/test_stop_signals.py: a headless Chromium through
Selenium (chromedriver, chromium and its helpers) and a gate on the embedded default whose all-reduce runs for
minutes (ansible-playbook, the detached node call, torchrun and its ranks).  Not collected by default (no ``test_``
prefix): the signal test names it to scripts/run-pytest.  ``STOP_TARGET_READY`` is the file written once the
browser is up, before the gate starts."""

import os
import shutil

import cluster_preflight

# An all-reduce of minutes on two CPU ranks (the ranges of cluster_preflight/settings_check.py).
LONG_GATE = {"allreduce_iters": 100000, "allreduce_sizes": [1048576], "allreduce_timeout": 300,
             "allreduce_hard_timeout": 400}


def _browser():
    """A headless Chromium, or None where this machine has none (the gate alone is held then)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        return None
    from selenium import webdriver  # pylint: disable=import-outside-toplevel

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)


def test_hold_a_browser_and_a_long_gate(tmp_path):
    browser = _browser()
    try:
        with open(os.environ["STOP_TARGET_READY"], "w") as handle:
            handle.write("browser\n" if browser else "no browser\n")
        result = cluster_preflight.gate(extravars=LONG_GATE, results_dir=str(tmp_path / "results"))
        assert result.exit_code == 0, result.error
    finally:
        if browser is not None:
            browser.quit()
