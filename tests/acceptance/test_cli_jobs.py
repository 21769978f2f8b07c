"""``floodway job submit|show|cancel|retry`` end to end, against `floodway serve`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.clirun import cli, served


async def test_a_job_submitted_from_a_file_runs_and_shows(tmp_path: Path) -> None:
    steps = [
        {"name": "draw", "kind": "img", "input": {"prompt": "a cat"}},
        {"name": "again", "kind": "img", "input": {"prompt": "${steps.draw.result.echo.prompt}"},
         "after": ["draw"]},
    ]  # fmt: skip
    file = tmp_path / "job.json"
    file.write_text(json.dumps({"steps": steps}))
    async with served(tmp_path) as serving:
        code, out, err = await cli("job", "submit", str(file), "--wait", env=serving.env)
        assert code == 0, err
        job = json.loads(out)
        assert job["status"] == "succeeded"
        assert job["result"]["again"]["echo"] == {"prompt": "a cat"}
        code, out, _ = await cli("job", "show", job["id"], env=serving.env)
        assert code == 0 and json.loads(out)["id"] == job["id"]
        code, _, err = await cli("job", "cancel", job["id"], env=serving.env)
        assert code == 1 and "succeeded -> cancelled" in err and "Traceback" not in err
        code, _, err = await cli("job", "show", "j_nope", env=serving.env)
        assert code == 1 and "no job" in err
        file.write_text(json.dumps([{"name": "x", "kind": "paint", "input": {}}]))
        code, _, err = await cli("job", "submit", str(file), env=serving.env)
        assert code == 1 and "step 'x'" in err and "unknown kind" in err
        file.write_text("[oops")
        code, _, err = await cli("job", "submit", str(file), env=serving.env)
        assert code == 2 and "not JSON" in err
