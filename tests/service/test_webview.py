"""The web view of ``berth serve``: its routes over HTTP, and the page in a real headless
Chromium (Playwright driving Debian's browser), with a check of the screenshot."""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .serving import berth_serve

CLOUD = """
host_defaults: {cpu_allocation_ratio: 1.0, ram_allocation_ratio: 1.0}
hosts:
  - {host: "a{index:02d}", count: 4, cell: cell1, vcpus: 16, memory_mb: 32768, local_gb: 400}
  - {host: "b{index:02d}", count: 3, cell: cell1, vcpus: 16, memory_mb: 32768, local_gb: 400,
     vcpus_used: 16, memory_mb_used: 32000}
  - {host: "x01", cell: cell1, vcpus: 16, memory_mb: 32768, local_gb: 400,
     service: {disabled: true, disabled_reason: maintenance}}
cells: [{name: cell1}]
aggregates:
  - {name: east, availability_zone: east, hosts: [a01, a02, b01, b02]}
  - {name: west, availability_zone: west, hosts: [a03, a04, b03, x01]}
flavors:
  - {name: small, vcpus: 2, memory_mb: 4096, root_gb: 20}
  - {name: big, vcpus: 16, memory_mb: 30000, root_gb: 100}
"""
H = {"X-Auth-Token": "admin"}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("webview")
    cloud = workdir / "cloud.yaml"
    cloud.write_text(CLOUD)
    with berth_serve(workdir, "--cloud", str(cloud), "--seed", "1") as url:
        yield url


def usage(url: str) -> dict[str, dict[str, int]]:
    """Placement's usages of every provider."""
    headers = {**H, "OpenStack-API-Version": "placement 1.39"}
    providers = httpx.get(f"{url}/placement/resource_providers", headers=headers).json()
    return {p["uuid"]: httpx.get(f"{url}/placement/resource_providers/{p['uuid']}/usages",
                                 headers=headers).json()["usages"]
            for p in providers["resource_providers"]}


def test_what_if_explains_and_claims_nothing(served: str) -> None:
    before = usage(served)
    answer = httpx.post(served + "/what-if", headers=H, json={"flavor": "small", "num": 3})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["claimed"] is False and len(body["instances"]) == 3
    steps = [s["name"] for s in body["diagnosis"]["instances"][0]["steps"]]
    assert "placement" in steps[0] and "ComputeFilter" in steps
    assert usage(served) == before
    # What a boot would get, it gets: the same hosts (the seeded draws are not used up).
    boot = httpx.post(served + "/boot", headers=H, json={"flavor": "small", "num": 3}).json()
    assert [i["host"] for i in boot["instances"]] == [i["host"] for i in body["instances"]]


def test_what_if_of_a_boot_that_cannot_fit_says_why(served: str) -> None:
    answer = httpx.post(served + "/what-if", headers=H, json={"flavor": "big", "num": 9})
    assert answer.status_code == 409
    body = answer.json()
    assert body["error"]["code"] == "berth.scheduling.no_valid_host"
    assert body["error"]["cause"] == "hosts" and body["diagnosis"]["instances"]
    member = httpx.post(served + "/what-if", headers={"X-Auth-Token": "demo:demo"},
                        json={"flavor": "small"})
    assert member.status_code == 403  # host by host detail is the operators', by default
    bad = httpx.post(served + "/what-if", headers=H, json={"flavor": "nope"})
    assert bad.status_code == 400 and "flavor" in bad.json()["error"]["message"]


def test_decisions_list_the_latest_boots_with_their_funnels(served: str) -> None:
    httpx.post(served + "/boot", headers=H, json={"flavor": "big", "num": 9})
    httpx.post(served + "/boot", headers=H, json={"flavor": "small"})
    decisions = httpx.get(served + "/decisions", headers=H).json()["decisions"]
    newest, refused = decisions[0], decisions[1]
    assert newest["outcome"] == "placed" and newest["flavor"] == "small"
    # The disabled host is left out by placement (its COMPUTE_STATUS_DISABLED trait):
    # no filter removed anything.
    assert newest["instances"][0]["host"] and newest["funnel"] == {}
    assert refused["outcome"] == "refused" and refused["num"] == 9
    assert refused["cause"] == "hosts" and refused["instances_fit"] < 9
    assert httpx.get(served + "/decisions").status_code == 401
    assert httpx.get(served + "/decisions", headers={"X-Auth-Token": "demo:demo"}).status_code == 403


def test_server_groups_are_created_and_checked(served: str) -> None:
    made = httpx.post(served + "/server-groups", headers=H,
                      json={"name": "web", "policy": "anti-affinity",
                            "rules": {"max_server_per_host": 2}})
    assert made.status_code == 200
    group = made.json()["server_group"]
    assert group["policy"] == "anti-affinity" and group["rules"] == {"max_server_per_host": 2}
    for body, field in [({"name": "g", "policy": "friendly"}, "policy"),
                        ({"policy": "affinity"}, "name"),
                        ({"name": "g", "policy": "affinity",
                          "rules": {"max_server_per_host": 2}}, "rules.max_server_per_host"),
                        ({"name": "g", "policy": "anti-affinity", "colour": 1}, "colour")]:
        answer = httpx.post(served + "/server-groups", headers=H, json=body)
        assert answer.status_code == 400
        assert answer.json()["error"]["message"].startswith(field)


def test_capacity_runs_in_the_background(served: str) -> None:
    assert httpx.post(served + "/capacity", headers=H,
                      json={"limit": 0}).json()["error"]["message"].startswith("limit")
    assert httpx.post(served + "/capacity", headers=H,
                      json={"flavors": ["huge"]}).status_code == 400
    started = httpx.post(served + "/capacity", headers=H, json={"flavors": ["small"],
                                                                 "limit": 500})
    assert started.status_code == 202
    state = wait_capacity(served)
    (small,) = state["report"]["flavors"]
    assert small["flavor"] == "small" and small["fits"] > 0 and not small["capped"]


def wait_capacity(url: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(url + "/capacity", headers=H).json()
        if state["status"] != "running":
            assert state["status"] == "ready", state
            return state
        time.sleep(0.5)
    raise AssertionError("capacity did not finish")


def test_the_page_is_served_without_a_token_and_fetches_nothing_elsewhere(served: str) -> None:
    page = httpx.get(served + "/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "http://" not in page.text and "https://" not in page.text


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (make browser installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"])
        try:
            yield browser
        finally:
            browser.close()


def test_the_web_view_in_a_real_browser(served: str, browser: Any, tmp_path: Path) -> None:
    from PIL import Image

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served + "/ui")
    # Hosts: all eight, grouped by cell and zone; the disabled one drawn as down.
    page.wait_for_selector(".host[data-host='x01']")
    assert page.locator("#hosts .host").count() == 8
    groups = page.locator(".group h3").all_inner_texts()
    assert any("east" in g for g in groups) and any("west" in g for g in groups)
    assert "down" in (page.locator(".host[data-host='x01']").get_attribute("class") or "")
    page.select_option("#groupby", "aggregate")
    page.wait_for_selector(".group h3:text-matches('^east')")
    page.select_option("#groupby", "zone")
    page.wait_for_selector(".group h3:has-text('cell')")
    # The latest decisions, with the boots made so far.
    page.wait_for_selector("#decisions tr td")
    assert "small" in page.locator("#decisions").inner_text()
    # What-if: the explained decision, and the funnel.
    page.select_option("#wi-flavor", "small")
    page.fill("#wi-num", "2")
    page.click("#whatif button")
    page.wait_for_selector("#whatif-result .funnel")
    result = page.locator("#whatif-result").inner_text()
    assert "would place on" in result and "ComputeFilter" in result
    # Capacity by flavor, computed in the background.
    page.fill("#cap-limit", "300")
    page.click("#capacity button")
    page.wait_for_selector("#capacity-result table", timeout=120_000)
    assert "small" in page.locator("#capacity-result").inner_text()
    # The screenshot shows what the page says: a full host in red, an empty one green.
    shot = page.screenshot(full_page=True)
    (tmp_path / "webview.png").write_bytes(shot)
    image = Image.open(io.BytesIO(shot)).convert("RGB")
    assert image.size[0] == 1400 and len(image.getcolors(maxcolors=1 << 20) or []) > 50

    def color_of(host: str) -> tuple[int, int, int]:
        box = page.locator(f".host[data-host='{host}']").bounding_box()
        assert box is not None
        return image.getpixel((int(box["x"] + box["width"] / 2),  # type: ignore[return-value]
                               int(box["y"] + box["height"] / 2)))

    full, emptyish = color_of("b01"), color_of("a04")
    assert full[0] > full[1] + 60, full  # red: the host is full
    assert emptyish[1] > emptyish[0], emptyish  # green: nearly empty
    assert not errors, errors
    page.close()
