"""The dashboard in a real browser: headless Chromium loads the page while
the program runs actors, tasks and a Serve app, and the page shows them and
updates.  A screenshot is kept: under $RAY_LITE_TEST_ARTIFACTS when set (a
CI's artifact directory), else in the test's tmp_path."""
import os
import pathlib
import shutil
import signal
import subprocess

import pytest

import ray_lite
from ray_lite import serve

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                               "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: apt-get install -y chromium chromium-driver")


@ray_lite.remote
class BrowserSeen:
    def ping(self):
        return "pong"


@ray_lite.remote
def browser_task(x):
    return x + 1


@serve.deployment
class BrowserApp:
    def __call__(self, request):
        return "hi"


def _chromium(profile, *args):
    """Run headless Chromium to its end, 180 s at most.

    In a session of its own, its output in files: Chromium's helpers
    (crashpad, zygote) inherit what it was given, so output through pipes
    could be waited for forever after it was killed, and only the whole
    group can be ended."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={profile}", "--window-size=1280,1800", *args]
    out_path, err_path = profile.parent / "chromium.out", profile.parent / "chromium.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("headless Chromium did not end within 180 s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # its helpers, if any outlived it
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode,
                                       out_path.read_text(errors="replace"),
                                       err_path.read_text(errors="replace"))


def _dom(profile, url):
    # Virtual time lets the page's timer fire a few refreshes without waiting.
    out = _chromium(profile, "--virtual-time-budget=6000", "--dump-dom", url)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture
def program():
    ctx = ray_lite.init(num_cpus=1, include_dashboard=True, dashboard_port=0,
                        runtime_env={"env_vars": {"RAY_LITE_TIMELINE": "1"}})
    try:
        serve.start(http_options={"port": 0, "proxies": 1})
        serve.run(BrowserApp.bind(), name="browser_app", route_prefix="/b")
        yield ctx
    finally:
        try:
            serve.shutdown()
        finally:
            ray_lite.shutdown()


def test_the_page_shows_the_program_and_updates(program, tmp_path):
    url = f"http://{program.dashboard_url}/"
    profile = tmp_path / "profile"
    first = BrowserSeen.options(name="first-actor").remote()
    assert ray_lite.get(first.ping.remote()) == "pong"
    assert ray_lite.get([browser_task.remote(i) for i in range(3)]) == [1, 2, 3]
    dom = _dom(profile, url)
    assert "first-actor" in dom and "BrowserSeen" in dom
    assert "browser_task" in dom            # recent tasks, and the timeline's bars
    assert "browser_app" in dom and "BrowserApp" in dom
    assert 'class="event"' in dom
    # The page refreshes itself: the counter it keeps went past its first load.
    refreshes = int(dom.split('data-refreshes="', 1)[1].split('"', 1)[0])
    assert refreshes >= 2
    # What the program does next shows on the next load.
    second = BrowserSeen.options(name="second-actor").remote()
    ray_lite.get(second.ping.remote())
    assert "second-actor" in _dom(profile, url)
    artifacts = pathlib.Path(os.environ.get("RAY_LITE_TEST_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "dashboard.png"
    out = _chromium(profile, "--virtual-time-budget=6000", f"--screenshot={shot}", url)
    assert out.returncode == 0, out.stderr[-2000:]
    assert shot.stat().st_size > 10_000
