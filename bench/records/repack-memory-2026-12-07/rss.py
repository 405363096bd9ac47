# One engine process: its resident memory after a short generation, weight repacking on or off.
# python bench/records/repack-memory-2026-12-07/rss.py MODEL 1|0
import sys, json
from cospec_local import Engine
model, repack = sys.argv[1], sys.argv[2] == "1"
e = Engine(model, n_threads=2, calibration=None, repack=repack, n_ctx=1024)
e.generate("Hello there, how are you?", max_tokens=8)
st = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(("VmRSS", "RssAnon", "RssFile"))}
print(json.dumps({"model": model, "repack": repack, "repacked_mb": e.repacked_bytes["target"] / 2**20, **{k: v / 1024 for k, v in st.items()}}))
