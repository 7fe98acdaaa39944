"""Request hooks for tests: count executions, slow requests down."""
import os
import stat


def counting_hook(directory, request="ping", sleep=0.0, log_name="executions.log"):
    """A pre hook that appends ``automation index host`` to a log, then sleeps."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{request}.pre")
    log = os.path.join(directory, log_name)
    with open(path, "w") as hook:
        hook.write(f"""#!/usr/bin/env python3
import json, sys, time
event = json.load(sys.stdin)
with open({log!r}, "a") as log:
    log.write(f"{{event['automation']}} {{event['index']}} {{event['host']}}\\n")
time.sleep({sleep})
""")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return log


def executions(log_path):
    if not os.path.exists(log_path):
        return []
    with open(log_path) as log:
        return [tuple(line.split()) for line in log if line.strip()]


def recording_hook(directory, request, phase, script=""):
    """A ``phase`` hook that appends its stdin (one JSON object) to
    ``<request>.<phase>.jsonl``, then runs ``script`` (Python, with the
    payload as ``event``), which may write to stderr and exit non-zero."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{request}.{phase}")
    record = os.path.join(directory, f"{request}.{phase}.jsonl")
    with open(path, "w") as hook:
        hook.write(f"""#!/usr/bin/env python3
import json, sys
event = json.load(sys.stdin)
with open({record!r}, "a") as out:
    out.write(json.dumps(event) + "\\n")
{script}
""")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return record


def recorded(record_path):
    import json
    if not os.path.exists(record_path):
        return []
    with open(record_path) as record:
        return [json.loads(line) for line in record if line.strip()]
