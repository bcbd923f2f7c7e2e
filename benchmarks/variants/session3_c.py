"""Session 3, third A/B round: bf16x3_wu.py (stage 1) and stage2_prefetch2.py (stage 2) in one device call."""
import importlib.util, os

def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

_x3, _p2 = _load("bf16x3_wu"), _load("stage2_prefetch2")
STAGE1 = _x3.STAGE1
STAGE2 = _p2.STAGE2
LAUNCH = _p2.LAUNCH
