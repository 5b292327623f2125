"""The gateway runs without torch: its program and the modules its server loads import neither torch nor
transformers (the network is the actors'), so each gateway process starts in a fraction of the time and memory."""

from __future__ import annotations

import subprocess
import sys

GATEWAY_MODULES = ("forge.gateway.cli", "forge.gateway.server", "forge.gateway.service", "forge.gateway.servicer",
                   "forge.gateway.http.app", "forge.gateway.grammar_check", "forge.sampling.wire")


def test_the_gateways_modules_import_no_torch():
    probe = (f"import sys\nfor name in {GATEWAY_MODULES!r}:\n    __import__(name)\n"
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_the_probe_sees_a_module_that_imports_torch():
    probe = "import sys, forge.sampling.sampling\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "True", result.stderr
