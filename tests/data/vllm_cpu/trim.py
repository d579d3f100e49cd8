"""Trim a recorded vLLM worker trace for the repository: drop its `python_function` events (the Python
stacks: 57,000 of its 64,000 events), keep everything else byte for byte (json round trip).
Stdlib only:  python3 trim.py IN.pt.trace.json.gz OUT.pt.trace.json.gz"""

import gzip
import json
import sys

src, dst = sys.argv[1], sys.argv[2]
with gzip.open(src, "rt") as f:
    doc = json.load(f)
events = doc["traceEvents"]
doc["traceEvents"] = [e for e in events if e.get("cat") != "python_function"]
with gzip.open(dst, "wt", compresslevel=9) as f:
    json.dump(doc, f, separators=(",", ":"))
print(f"{src}: kept {len(doc['traceEvents'])} of {len(events)} events")
