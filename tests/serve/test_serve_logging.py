"""Serve's logging, as Ray Serve's: a replica's ``"ray.serve"`` logger writes
Ray Serve's format (TEXT or JSON, with the deployment, replica, request id,
route and application) to standard error, and to a file with ``logs_dir``;
``logging_config`` on a deployment wins over its application's, which wins
over the default (INFO, TEXT)."""
import json
import logging
import subprocess
import sys

import pytest

from ray_lite import serve
from ray_lite.serve.config import ConfigError, parse
from ray_lite.serve.schema import LoggingConfig

from serve_helpers import http, wait_until

logger = logging.getLogger("ray.serve")


@serve.deployment(logging_config={"encoding": "JSON", "log_level": "DEBUG",
                                  "additional_log_standard_attrs": ["funcName"]})
class Json:
    def __init__(self):
        logger.info("json replica made")

    async def __call__(self, request):
        logger.debug("json debug record")
        return "json"


@serve.deployment
class Text:
    async def __call__(self, request):
        logger.info("text info record")
        logger.debug("text debug record")
        return "text"


def _records(log_dir, pattern, needle):
    """The lines of the replica log files ``pattern`` in ``log_dir``, once
    ``needle`` is among them."""
    lines = []

    def found():
        lines[:] = [ln for p in log_dir.glob(pattern) for ln in p.read_text().splitlines()]
        return any(needle in ln for ln in lines)
    wait_until(found, f"{needle!r} in {pattern}", timeout=30)
    return lines


def test_json_records_carry_the_request_being_served(serve_port, tmp_path):
    app = Json.options(logging_config={"encoding": "JSON", "log_level": "DEBUG",
                                       "logs_dir": str(tmp_path),
                                       "additional_log_standard_attrs": ["funcName"]})
    serve.run(app.bind(), name="japp", route_prefix="/j")
    status, headers, body = http(serve_port, "GET", "/j")
    assert (status, body) == (200, b"json")
    lines = _records(tmp_path, "replica_japp_Json_*.log", "json debug record")
    records = {r["message"]: r for r in map(json.loads, lines)}
    made, served = records["json replica made"], records["json debug record"]
    assert made["deployment"] == "Json" and made["component_name"] == "replica"
    assert "request_id" not in made     # outside a request
    assert served["levelname"] == "DEBUG" and served["replica"] == made["replica"]
    assert served["request_id"] == headers["x-request-id"]
    assert (served["route"], served["application"]) == ("/j", "japp")
    assert served["funcName"] == "__call__"


def test_the_apps_config_applies_unless_the_deployment_has_its_own(serve_port, tmp_path):
    app_dir, own_dir = tmp_path / "app", tmp_path / "own"
    serve.run(Text.bind(), name="plain", route_prefix="/plain",
              logging_config={"logs_dir": str(app_dir)})
    serve.run(Text.options(name="Debugged").bind(), name="dbg", route_prefix="/dbg",
              logging_config=LoggingConfig(log_level="DEBUG", logs_dir=str(app_dir)))
    # The deployment's own config wins over the application's (ERROR).
    serve.run(Text.options(name="Own", logging_config={"log_level": "DEBUG",
                                                       "logs_dir": str(own_dir)}).bind(),
              name="own", route_prefix="/own", logging_config={"log_level": "ERROR"})
    _, headers, _ = http(serve_port, "GET", "/plain")
    lines = _records(app_dir, "replica_plain_Text_*.log", "text info record")
    # Ray Serve's TEXT format: LEVEL time deployment replica request_id -- message
    line = next(ln for ln in lines if "text info record" in ln)
    assert line.startswith("INFO ")
    assert line.endswith(f" Text 1 {headers['x-request-id']} -- text info record")
    assert not any("text debug record" in ln for ln in lines)     # INFO by default
    http(serve_port, "GET", "/dbg")
    _records(app_dir, "replica_dbg_Debugged_*.log", "text debug record")
    http(serve_port, "GET", "/own")
    _records(own_dir, "replica_own_Own_*.log", "text debug record")


SCRIPT = """
import logging
import ray_lite
from ray_lite import serve
from ray_lite.serve.api import _http_port
import urllib.request

@serve.deployment
class Hi:
    async def __call__(self, request):
        logging.getLogger("ray.serve").info("hello from the replica")
        return "hi"

ray_lite.init(num_cpus=1)
serve.start(http_options={"host": "127.0.0.1", "port": 0, "proxies": 1})
serve.run(Hi.bind())
assert urllib.request.urlopen(f"http://127.0.0.1:{_http_port()}/", timeout=30).read() == b"hi"
serve.shutdown()
ray_lite.shutdown()
"""


def test_replica_records_reach_the_drivers_standard_error():
    # INFO shows by default, as in Ray Serve (before, a replica's INFO
    # records went nowhere: its root logger had no handler).
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if "hello from the replica" in ln)
    assert line.startswith("(ServeReplica pid=") and ") INFO " in line
    assert " Hi 1 " in line and line.endswith("-- hello from the replica")


def test_bad_logging_configs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="invalid encoding type 'XML'"):
        serve.deployment(logging_config={"encoding": "XML"})(Text.func_or_class)
    with pytest.raises(ValueError, match="unknown fields \\['colour'\\]"):
        Text.options(logging_config={"colour": "red"})
    with pytest.raises(ValueError, match="log_level must be one of"):
        LoggingConfig(log_level="LOUD")
    with pytest.raises(ConfigError, match=r"applications\[0\].logging_config"):
        parse({"applications": [{"import_path": "m:app",
                                 "logging_config": {"encoding": "YAML"}}]})
    assert LoggingConfig(log_level=10).log_level == "DEBUG"


MAIN_SCRIPT = """
import logging, sys
import ray_lite
from ray_lite import serve

@serve.deployment(logging_config={"encoding": "JSON", "logs_dir": sys.argv[1]})
class FromMain:
    def __call__(self, request=None):
        logging.getLogger("ray.serve").info("logged from main")
        raise ValueError("raised from main")

ray_lite.init(num_cpus=1)
handle = serve.run(FromMain.bind(), name="m", route_prefix=None)
try:
    handle.remote().result(timeout_s=60)
except ValueError as exc:
    print("ERROR:", str(exc).replace(chr(10), " | "))
serve.shutdown()
ray_lite.shutdown()
"""


def test_a_class_from_main_keeps_its_file_name_in_records_and_tracebacks(tmp_path):
    """A deployment defined in the script being run travels by value; its
    records and tracebacks name the script and its lines, as a task's do
    (they said ``<dynamic-code>``)."""
    script = tmp_path / "deploy_from_main.py"
    script.write_text(MAIN_SCRIPT)
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, str(script), str(logs)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = next(json.loads(ln) for ln in _records(logs, "replica_m_FromMain_*.log",
                                                    "logged from main")
                  if "logged from main" in ln)
    assert record["filename"] == "deploy_from_main.py", record
    error = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR:"))
    assert f'File "{script}", line 10' in error and "raised from main" in error, error
