"""schemathesis against the admin API's own OpenAPI document: no input gives a 500.

Runs the schemathesis command line against a real service on a real database, with the
admin token (so requests reach the handlers) and the server-error check only: the API's
answers to nonsense are 4xx by design, which other checks would count against it.

The secret rotation route is left out: it is a gateway to the provider, and answers 502/503
by design when the provider refuses or is not configured (its tests: test_chat_rotation).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import running_service

TOKEN = "schemathesis-admin-token"


def test_no_generated_request_makes_the_admin_api_answer_500(db_url: str) -> None:
    tool = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.fail("schemathesis is not installed (pip install '.[test]')")
    with running_service(db_url, admin_token=TOKEN) as base:
        done = subprocess.run(
            [tool, "run", f"{base}/api/openapi.json", "--checks", "not_a_server_error",
             "--header", f"Authorization: Bearer {TOKEN}", "--max-examples", "60",
             "--request-timeout", "10", "--exclude-path-regex", "rotate-secret"],
            capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
