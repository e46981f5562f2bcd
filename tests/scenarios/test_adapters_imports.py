"""The adapters import their framework themselves, lazily; nothing else in the package does."""
import subprocess
import sys


FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "accelerate", "torchtitan")


def test_importing_an_adapter_imports_no_framework():
    """``adapters.torchtitan_cpu`` is not one: importing it patches torchtitan, on purpose."""
    code = ("import sys; from pytest_reshard.adapters import hf, lightning, accelerate, torchtitan; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
