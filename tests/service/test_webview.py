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
    assert not newest["explained"] and "diagnosis" not in newest
    assert httpx.get(served + "/decisions").status_code == 401
    assert httpx.get(served + "/decisions", headers={"X-Auth-Token": "demo:demo"}).status_code == 403


def test_an_explained_decision_is_read_by_its_id(served: str) -> None:
    """The list leaves explanations out (the page reads it every few seconds); one
    decision's is read by its id."""
    answer = httpx.post(served + "/boot", headers=H,
                        json={"flavor": "small", "num": 2, "explain": True})
    assert answer.status_code == 200, answer.text
    listed = httpx.get(served + "/decisions", headers=H).json()["decisions"][0]
    assert listed["explained"] and "diagnosis" not in listed and listed["num"] == 2
    one = httpx.get(f"{served}/decisions/{listed['id']}", headers=H)
    assert one.status_code == 200
    diagnosis = one.json()["decision"]["diagnosis"]
    assert [i["index"] for i in diagnosis["instances"]] == [0, 1]
    assert diagnosis["instances_left_out"] == 0
    for ref in ("0", "999999", "x", "9" * 5000):
        missing = httpx.get(f"{served}/decisions/{ref}", headers=H)
        assert missing.status_code == 404 and "no decision" in missing.json()["error"]["message"]
    assert httpx.post(f"{served}/decisions/1", headers=H).status_code == 405
    assert httpx.get(f"{served}/decisions/{listed['id']}").status_code == 401
    for inst in answer.json()["instances"]:  # the capacity test counts on the room
        assert httpx.delete(f"{served}/servers/{inst['instance_uuid']}",
                            headers=H).status_code in (200, 202, 204)


def test_a_kept_explanation_has_a_bounded_size() -> None:
    """An explained boot of 1,000 instances on 3,000 hosts kept ~10 MB: the first and
    last instances are kept (a refusal's cause is in its last), each step's first
    rejections and the best hosts by weight, with counts of what was left out."""
    from berth.service.webview import (
        KEPT_INSTANCES,
        KEPT_REJECTIONS,
        KEPT_WEIGHED,
        kept_explanation,
    )

    def instance(index: int) -> dict[str, Any]:
        return {"index": index, "steps": [{"name": "ComputeFilter", "hosts_in": 3000,
                                            "hosts_out": 0, "rejections": [
                                                {"host": f"h{i}", "reason": "down"}
                                                for i in range(3000)]}],
                "weighing": [{"host": f"h{i}", "weight": (i * 7919) % 101 / 100.0}
                             for i in range(40)]}

    kept = kept_explanation({"summary": "s", "instances": [instance(i) for i in range(30)]})
    assert [i["index"] for i in kept["instances"]] == [*range(10), *range(20, 30)]
    assert len(kept["instances"]) == KEPT_INSTANCES and kept["instances_left_out"] == 10
    for inst in kept["instances"]:
        (step,) = inst["steps"]
        assert len(step["rejections"]) == KEPT_REJECTIONS
        assert step["rejections_left_out"] == 3000 - KEPT_REJECTIONS
        weights = [w["weight"] for w in inst["weighing"]]
        assert len(weights) == KEPT_WEIGHED and inst["weighed_left_out"] == 40 - KEPT_WEIGHED
        assert weights == sorted(weights, reverse=True) and weights[0] == 1.0


def test_a_boot_of_which_nothing_was_built_is_not_shown_as_built() -> None:
    from berth.service.webview import RecentDecisions

    class Spec:
        flavor = type("F", (), {"name": "small"})()
        num_instances, project_id, availability_zone = 2, "p", None

    class Decision:
        rejections: dict[str, int] = {}
        diagnosis = None

    recent = RecentDecisions()
    failed = [{"instance_uuid": "a"}, {"instance_uuid": "b"}]
    recent.placed(Spec(), Decision(), {"instances": [], "failed": failed}, 0.1)
    recent.placed(Spec(), Decision(), {"instances": [{"instance_uuid": "a", "host": "h"}],
                                       "failed": failed[1:]}, 0.1)
    partly, nothing = recent.latest(2)
    assert nothing["outcome"] == "not built" and nothing["message"] == "2 of 2 not built"
    assert partly["outcome"] == "partly built"


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
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # Only the page's own script runs (by its hash): no inline handler, no injected one.
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy.split(";")[1]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "http://" not in page.text and "https://" not in page.text
    head = httpx.head(served + "/ui")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == page.headers["content-length"]
    assert httpx.get(served + "/healthz").headers["x-content-type-options"] == "nosniff"
    assert "HEAD" in httpx.post(served + "/hosts", headers=H).headers["allow"]


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
