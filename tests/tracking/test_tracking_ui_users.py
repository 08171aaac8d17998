"""The MLflow UI serves the private store to its owner only, as a second local user sees it: no
runs listed, no rank log read, no run deleted; a port that user holds is never linked; the UI's
log is a new private file of ours, never one prepared for us."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from eventually import eventually
from mlflow import MlflowClient
from tracking_checks import http_status

from serverless_gpu.runfiles import rundirs
from serverless_gpu.tracking import stop_ui, store, ui

_USER = "sgpu-other"
_CURL = shutil.which("curl")


class OtherUser:
    """A second local account, and an interpreter it may run (only its standard library)."""

    def __init__(self, name: str, python: str) -> None:
        self.name = name
        self.python = python

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, user=self.name, capture_output=True, text=True, timeout=60, cwd="/"
        )

    def curl(self, url: str, *options: str) -> tuple[int, str]:
        """HTTP status and body, as this user's request sees them."""
        assert _CURL is not None
        done = self.run(_CURL, "-s", "-m", "10", "-w", "\n%{http_code}", *options, url)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body


def _python_for(user: str) -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if not os.path.exists(candidate):
            continue
        probe = subprocess.run([candidate, "-I", "-c", "pass"], user=user, capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def other_user() -> OtherUser:
    if os.geteuid() != 0:
        pytest.skip("a second local user is needed: run as root to have the test create one")
    if _CURL is None:
        pytest.skip("curl is needed to make the second user's requests")
    if subprocess.run(["id", "-u", _USER], capture_output=True).returncode != 0:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _USER],
            capture_output=True,
            text=True,
        )
        assert made.returncode in (0, 9), made.stderr  # 9: made meanwhile by another test
    python = _python_for(_USER)
    if python is None:
        pytest.skip(f"no Python interpreter that {_USER} may run")
    return OtherUser(_USER, python)


@pytest.fixture
def served(embedded: MlflowClient) -> Iterator[tuple[str, str, str]]:
    """The UI of the module's store, serving a run with a rank log: (address, run, experiment)."""
    experiment = embedded.create_experiment(f"users-{os.urandom(4).hex()}")
    run = embedded.create_run(experiment).info.run_id
    embedded.log_text(run, "rank 0 secret line\n", "logs/rank_0.txt")
    address = ui()
    try:
        yield address, run, experiment
    finally:
        stop_ui()


def test_another_user_cannot_list_read_or_delete_runs(
    served: tuple[str, str, str], other_user: OtherUser, embedded: MlflowClient
) -> None:
    address, run, experiment = served
    search = f"{address}/ajax-api/2.0/mlflow/runs/search"
    query = json.dumps({"experiment_ids": [experiment]})
    form = ("-H", "Content-Type: application/json", "-d", query)
    artifact = f"{address}/get-artifact?path=logs/rank_0.txt&run_uuid={run}"
    # The owner's browser gets everything.
    assert http_status(artifact) == 200
    code, body = other_user.curl(search, *form)
    assert code == 403, body
    assert run not in body
    code, body = other_user.curl(artifact)
    assert (code, "secret" in body) == (403, False), body
    delete = json.dumps({"run_id": run})
    code, _ = other_user.curl(
        f"{address}/ajax-api/2.0/mlflow/runs/delete",
        "-H",
        "Content-Type: application/json",
        "-d",
        delete,
    )
    assert code == 403
    assert embedded.get_run(run).info.lifecycle_stage == "active"


_SQUATTER = """
import http.server, json, sys
body = sys.argv[2].encode()
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Page)
print("listening", flush=True)
server.serve_forever()
"""


def test_a_port_another_user_holds_is_never_linked(
    embedded: MlflowClient, other_user: OtherUser
) -> None:
    """Even a page that answers like this store's UI (the experiments it once saw listed)."""
    uri = f"sqlite:///{Path.cwd()}/mlflow.db"
    first = store.ui_ports(uri)[0]
    experiments = [
        {"experiment_id": e.experiment_id, "name": e.name, "creation_time": e.creation_time}
        for e in embedded.search_experiments(max_results=1000)
    ]
    fake = json.dumps({"experiments": experiments})
    squatter = subprocess.Popen(
        [other_user.python, "-I", "-c", _SQUATTER, str(first), fake],
        user=other_user.name,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline().strip() == "listening"
        # Before any UI: neither the run's link nor the printed hint names the squatted port.
        assert f":{first}/" not in store.run_link(uri, "0", "abc")
        assert f":{first}/" not in store.open_hint(uri, "0", "abc")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            address = ui(wait=False)
        assert address != f"http://127.0.0.1:{first}"
        assert any("another user's process" in str(w.message) for w in caught)
        assert store.ui_address(uri) == address
        assert f":{first}/" not in store.run_link(uri, "0", "abc")
    finally:
        stop_ui()
        squatter.kill()
        squatter.wait()


def test_the_ui_log_is_a_new_private_file_never_one_planted_for_it(
    embedded: MlflowClient, other_user: OtherUser
) -> None:
    # Where the log used to go: a name any user can predict, in a folder all users share.
    planted = Path(tempfile.gettempdir()) / f"serverless-gpu-mlflow-ui-{os.getpid()}.log"
    made = other_user.run(
        other_user.python, "-I", "-c",
        f"import os; os.close(os.open({str(planted)!r}, os.O_CREAT | os.O_WRONLY, 0o666))",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    pattern = f"mlflow-ui-{os.getpid()}-*.log"
    before = set(rundirs.runs_root().glob(pattern))
    try:
        ui()  # returns once the server answers: it has written its first lines by then
        assert planted.stat().st_size == 0, planted.read_text()[:200]
        logs = sorted(set(rundirs.runs_root().glob(pattern)) - before)
        assert len(logs) == 1, logs
        info = logs[0].stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o600)
        eventually(lambda: logs[0].stat().st_size > 0, "the server writes its log")
    finally:
        stop_ui()
        planted.unlink(missing_ok=True)


def test_the_socket_table_names_the_owner_of_a_listener_and_of_a_connection() -> None:
    from serverless_gpu.tracking import ui_gate

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert ui_gate.listener_uid(port) == os.getuid()
        with socket.create_connection(("127.0.0.1", port)):
            conn, _ = listener.accept()
            with conn:
                assert ui_gate.peer_uid(conn) == os.getuid()
    assert ui_gate.listener_uid(port) is None
