"""The watcher of a detached run: a small process in a session of its own that owns the run's
process group once `serve --detach` has returned.

Every `WATCH_POLL_S` (0.25 s) it reads the run's record and its recorded members (API server, engine
cores, workers) from /proc. When one is gone it ends the rest of the group (`runs.end_dead`:
SIGKILL after `runs.ORPHAN_GRACE_S`, since processes orphaned by a dead API server ignore SIGTERM)
and records the run as died with the cause (and vLLM's own line naming a lost rank, where the log
has one), unless a stop has begun (`runs.claim_death`, under the run's lock: a member ended by
`kimictl stop` is no death). It exits then, or as soon as the record leaves `ready` (`kimictl
stop` took over) or the group is gone. It imports only runs.py and startup.py: about 20 MB.

Run as `python -m kimictl.runtime.serving.watch RUN_ID`; `spawn_watcher` starts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kimictl.runtime.serving import runs
from kimictl.runtime.serving.runs import RunRecord, RunState
from kimictl.runtime.serving.startup import lost_member_line

__all__ = ["WATCH_POLL_S", "spawn_watcher", "watch"]

# A member gone is seen within this; a poll reads run.json and a few /proc stat files (under a
# millisecond of CPU).
WATCH_POLL_S = 0.25


def spawn_watcher(record: RunRecord) -> dict[str, Any]:
    """Start the watcher of `record` (its own session, so it is no member of the run's group and
    outlives the kimictl that detached); what the record keeps of it."""
    log = Path(record.run_dir) / "watch.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kimictl.runtime.serving.watch", record.id],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "KIMICTL_STATE_DIR": str(Path(record.run_dir).parent.parent)},
        )
    return {"pid": process.pid, "start_ticks": runs.process_start_ticks(process.pid)}


def watch(run_id: str, *, poll_s: float = WATCH_POLL_S) -> str:
    """Watch the run until it ends; what ended the watch (the exit line of watch.log)."""
    while True:
        record = runs.read_record(run_id)
        if record is None:
            return "the run's record is gone"
        if record.state is not RunState.READY:
            return f"the run is {record.state.value}: kimictl stop or its supervisor took over"
        state, reason = runs.observed_state(record)
        if state is RunState.DIED:
            named = lost_member_line(record.log_path)  # vLLM's own line, where it wrote one
            reason = f"{reason}; vLLM: {named}" if named else reason
            # a `stop` may have begun since the read above (its SIGTERM is what took the member):
            # the death is written only under the run's lock and only while no stop has begun
            claimed = runs.claim_death(replace(record, state=state, reason=reason))
            if claimed is None:
                return "a stop began: kimictl stop took over"
            ended = runs.end_dead(claimed)
            if not runs.is_alive(ended):  # vLLM may have ended its own group before end_dead
                runs.clean_run_files(ended)
            return f"died: {ended.reason}"
        if not runs.is_alive(record):
            return "the run's processes are gone"
        time.sleep(poll_s)


if __name__ == "__main__":
    print(f"{time.strftime('%H:%M:%S')} watching {sys.argv[1]}", flush=True)
    print(f"{time.strftime('%H:%M:%S')} {watch(sys.argv[1])}", flush=True)
