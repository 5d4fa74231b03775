"""The control plane (cache, scheduler, simulated replay, the CLI's replay path) never imports torch."""
import subprocess
import sys

CODE = """
import sys
import radixkv, radixkv.cache, radixkv.scheduler, radixkv.config, radixkv.request, radixkv.batch
import radixkv.replay.replay, radixkv.replay.simulator, radixkv.replay.cost_model, radixkv.workloads.traces
import radixkv.plan, radixkv.model_shape
from radixkv import PagePool, RadixCache, Scheduler
from radixkv.cli import main
assert main(["replay", "--sequential"]) == 0
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded[:5]
"""


def test_control_plane_imports_no_torch():
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
