"""Settings for every test directory.

Hypothesis: no per-example deadline. CI runs on two shared cores next to a real control plane, where a
200 ms deadline measures the machine's load, not the code; speed is measured by benchmarks/ instead.
"""

from hypothesis import settings

settings.register_profile("specdeploy", deadline=None)
settings.load_profile("specdeploy")
