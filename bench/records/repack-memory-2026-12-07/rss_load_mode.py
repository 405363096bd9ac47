# The same, with a load mode (-lm): python bench/records/repack-memory-2026-12-07/rss_load_mode.py MODEL 1|0 none
import sys, json
from cospec_local import Engine
model, repack, mode = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
e = Engine(model, n_threads=2, calibration=None, repack=repack, n_ctx=1024, load_mode=mode)
r = e.generate("Hello there, how are you?", max_tokens=16)
st = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(("VmRSS", "RssAnon", "RssFile"))}
print(json.dumps({"model": model, "repack": repack, "load_mode": mode, "tps": r.stats.predicted_per_second if hasattr(r.stats, "predicted_per_second") else None, "repacked_mb": e.repacked_bytes["target"] / 2**20, **{k: v / 1024 for k, v in st.items()}}))
