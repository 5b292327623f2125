"""``forge dash`` in a real browser (headless Chromium through Selenium): on a run with a recorded pool, learner
metrics and a live pool service, the curves are drawn and follow the metrics file without a reload, the services'
health shows, sessions are listed and filtered, a transcript opens with its tokens coloured (by log-prob, advantage
and a learner checkpoint's importance ratio), a completion holding markup is shown as text (nothing runs, nothing is
parsed), the group's prefix tree is drawn, and the console stays free of errors (a Content-Security-Policy violation would be one). Screenshots go to the suite's output folder."""

from __future__ import annotations

import json

import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from forge.checkpoints import write_tiny_checkpoint

from helpers.browse_pool import MARKUP
from helpers.dash import make_run, start_dash
from helpers.processes import Service

pytestmark = pytest.mark.browser

WAIT_S = 60


@pytest.fixture(scope="module")
def dash_url(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("browser") / "run"
    make_run(run_dir)
    write_tiny_checkpoint(run_dir / "learner" / "checkpoints" / "step-00000005" / "model")
    # a live service for the health view: its ready file in the run directory is how the dash finds it
    pool_service = Service("pool-service", "forge", ["pool", "serve", "--path", str(run_dir / "other-pool"),
                                                     "--port", "0"], run_dir, timeout_s=120)
    dash = start_dash(run_dir, tmp_path_factory.mktemp("dash-out"), "--interval", "0.5")
    try:
        yield dash.info["url"], run_dir
    finally:
        dash.stop()
        pool_service.stop()


def wait(driver, condition, what: str):
    # the page redraws parts of itself while it loads, so an element found in one poll may be gone by the next look
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
                         ).until(condition, message=f"waiting for {what}")


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_curves_are_drawn_and_follow_the_metrics(browser, dash_url, screenshots):
    url, run_dir = dash_url
    browser.get(url)
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#curves polyline")) >= 9, "the curves")
    series = {p.get_attribute("data-series") for p in browser.find_elements(By.CSS_SELECTOR, "#curves polyline")}
    assert {"reward_mean", "reward/math", "reward/web", "loss", "tokens_per_s", "staleness_mean",
            "tree_compression"} <= series
    browser.save_screenshot(str(screenshots / "dash-curves.png"))
    with (run_dir / "learner" / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 31, "loss": 0.01, "tree_compression": 2.5}) + "\n")
    wait(browser, lambda d: "step 31" in d.find_element(By.CSS_SELECTOR, '[data-chart="loss"]').text,
         "the new step to be drawn without a reload")
    assert console_errors(browser) == []


def test_health_shows_the_live_service(browser, dash_url, screenshots):
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-tab="health"]').click()
    row = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#health-table tr.up[data-service="pool-service"]'),
               "the pool service to show up")[0]
    assert "pool" in row.text
    browser.save_screenshot(str(screenshots / "dash-health.png"))
    assert console_errors(browser) == []


def test_sessions_listed_filtered_and_markup_shown_as_text(browser, dash_url, screenshots):
    url, _ = dash_url
    browser.get(url + "?tab=trajectories")
    rows = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr"), "the sessions")
    assert [r.get_attribute("data-session") for r in rows] == ["open-0", "web-0", "web-1", "math-0", "math-1",
                                                               "math-2"]
    domain = browser.find_element(By.NAME, "domain")
    domain.send_keys("web")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr")) == 2, "the filter")
    browser.find_element(By.CSS_SELECTOR, 'tr[data-session="web-0"]').click()
    completion = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#session .completion"),
                      "the transcript")[0]
    assert completion.text == MARKUP                                     # the markup, visible as text
    assert browser.find_elements(By.CSS_SELECTOR, "#session script, #session img, #session b") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text                                      # noqa: B018 (the access is the check)
    tokens = browser.find_elements(By.CSS_SELECTOR, "#session .token")
    assert len(tokens) > 10                                              # one span per completion token
    for token in tokens:
        assert token.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        assert "log-prob" in token.get_attribute("title") and "id " in token.get_attribute("title")
    browser.save_screenshot(str(screenshots / "dash-markup-as-text.png"))
    assert console_errors(browser) == []


def test_transcript_colours_and_group_tree(browser, dash_url, screenshots):
    url, _ = dash_url
    browser.get(url + "?tab=trajectories")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-session="math-0"]'), "the sessions")[0].click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#session .call")) == 2, "math-0's two calls")
    by_logprob = [t.value_of_css_property("background-color")
                  for t in browser.find_elements(By.CSS_SELECTOR, "#session .token")]
    Select(browser.find_element(By.ID, "colour-by")).select_by_value("advantage")
    tokens = browser.find_elements(By.CSS_SELECTOR, "#session .token")
    assert [t.value_of_css_property("background-color") for t in tokens] != by_logprob
    assert "advantage 0.5000" in tokens[0].get_attribute("title")
    assert "tool" in browser.find_element(By.CSS_SELECTOR, '#session .call[data-call="1"]').text
    browser.find_element(By.ID, "show-tree").click()
    rows = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tree .tree-row"), "the prefix tree")
    assert rows[0].get_attribute("data-times") == "5"
    assert "5 samples" in browser.find_element(By.ID, "tree").text
    browser.save_screenshot(str(screenshots / "dash-transcript.png"))
    assert console_errors(browser) == []


def test_tokens_coloured_by_importance_ratio(browser, dash_url, screenshots):
    url, _ = dash_url
    browser.get(url + "?tab=trajectories")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-session="web-0"]'), "the sessions")[0].click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#session .token"), "the transcript")
    Select(browser.find_element(By.ID, "colour-by")).select_by_visible_text("importance ratio")
    wait(browser, lambda d: "checkpoint step 5" in d.find_element(By.ID, "ratio-status").text, "the ratios")
    assert Select(browser.find_element(By.ID, "ratio-step")).first_selected_option.text == "latest (5)"
    tokens = browser.find_elements(By.CSS_SELECTOR, "#session .token")
    assert len(tokens) > 10
    for token in tokens:
        assert token.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        title = token.get_attribute("title")
        assert "importance ratio " in title and "learner log-prob" in title and "checkpoint step 5" in title
    browser.save_screenshot(str(screenshots / "dash-importance-ratio.png"))
    assert console_errors(browser) == []
