"""Settings for every test directory.

Hypothesis: no per-example deadline. CI runs on two shared cores next to a real control plane, where a
200 ms deadline measures the machine's load, not the code; speed is measured by benchmarks/ instead.

The Hugging Face Hub: no test may wait on huggingface.co. `specdeploy plan` asks the Hub unless
HF_HUB_OFFLINE=1, so every test (and every process a test starts) runs with it set; a test of the Hub path
unsets it with monkeypatch and points HF_ENDPOINT at the fake Hub on loopback (devcluster/fakehub.py).
huggingface_hub reads the variable once, when it is imported, and then refuses every request, loopback
included; importing it here first keeps the library itself online for the tests that use it against
the fake Hub.
"""

import os

import huggingface_hub.constants  # noqa: F401  (before HF_HUB_OFFLINE is set: see above)
from hypothesis import settings

settings.register_profile("specdeploy", deadline=None)
settings.load_profile("specdeploy")

os.environ["HF_HUB_OFFLINE"] = "1"
