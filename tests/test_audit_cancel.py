"""A model audit is cancelled when a newer save comes (issue 50, item 5): the model being built is
killed at once, not at its time limit, and nothing of that audit is kept."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from conftest import FIXTURES, REPO
from lsp_client import LspClient
from tcaudit.config import Settings
from tcaudit.model import ModelAuditResult, collect_jobs
from tcaudit.model.sandbox import Cancelled, Limits, Sandbox
from tcaudit.source.parsing import read_source

pytestmark = pytest.mark.slow

LIMITS = Limits(time_limit=120.0, memory_budget=6 * 1024**3)


def _hanging_job(tmp_path):
    path = tmp_path / "hanging_constructor.py"
    shutil.copy(FIXTURES / "models" / "hanging_constructor.py", path)
    jobs, static, preload = collect_jobs([read_source(path)], Settings(), "bfloat16", LIMITS, ModelAuditResult())
    assert len(jobs) == 1 and not static
    return jobs[0], preload


def test_cancel_kills_the_model_being_built_and_refuses_the_next_until_resumed(tmp_path):
    pytest.importorskip("torch")
    job, preload = _hanging_job(tmp_path)
    sandbox = Sandbox()
    outcome: dict = {}

    def audit() -> None:
        started = time.monotonic()
        try:
            outcome["facts"] = sandbox.run([job], LIMITS, preload)
        except Cancelled:
            outcome["cancelled"] = True
        outcome["seconds"] = time.monotonic() - started

    try:
        thread = threading.Thread(target=audit)
        thread.start()
        deadline = time.monotonic() + 90
        while (sandbox.zygote is None or sandbox.zygote.current is None) and time.monotonic() < deadline:
            time.sleep(0.1)  # until the model's process is building it (torch imported, forked)
        assert sandbox.zygote is not None and sandbox.zygote.current is not None
        sandbox.cancel()
        thread.join(60)
        assert not thread.is_alive()
        assert outcome.get("cancelled"), outcome  # no facts of the killed build come back
        assert outcome["seconds"] < LIMITS.time_limit  # ended by the cancel, not by the time limit
        with pytest.raises(Cancelled):
            sandbox.run([job], LIMITS, preload)  # refused until the next audit resumes
        sandbox.resume()
        assert sandbox._not_cancelled()
    finally:
        sandbox.close()


def test_a_save_during_the_audit_cancels_it_and_the_newest_save_is_audited(tmp_path):
    """Through the server: two saves while the first audit builds a model that never finishes. The
    first audit is cancelled at the second save (the log says so), well before its time limit."""
    pytest.importorskip("torch")
    path = tmp_path / "train.py"
    text = (FIXTURES / "models" / "hanging_constructor.py").read_text()
    path.write_text(text)
    client = LspClient(tmp_path, env={"PYTHONPATH": str(REPO), "TCAUDIT_MODEL_TIMEOUT": "120"})
    try:
        client.initialize(tmp_path)
        uri = path.as_uri()
        client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                "text": text}})
        client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri, timeout=60)
        client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        time.sleep(8)  # the audit process imports torch and starts building the model, which never ends
        saved = time.monotonic()
        client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
        message = client.wait_for("window/logMessage", lambda p: "cancelled" in p["message"], timeout=60)
        assert "train.py" in message["message"] and "newer save" in message["message"]
        assert time.monotonic() - saved < 60  # the build's own limit is 120 s
    finally:
        client.close()
